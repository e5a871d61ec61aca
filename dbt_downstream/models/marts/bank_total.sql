-- One row: the sum over every bank table at the syncpoint (constant for the workload).
select
    {{ syncpoint_ts() }} as syncpoint_ts,
    count(*) as n_accounts,
    coalesce(sum(balance), 0) as total_balance
from {{ ref('account_balances') }}
