select
    account_key,
    bank_table,
    account_id,
    owner,
    balance,
    {{ syncpoint_ts() }} as syncpoint_ts
from {{ ref('stg_accounts') }}
