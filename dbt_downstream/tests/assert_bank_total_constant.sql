{{ config(meta={'dagster': {'ref': {'name': 'bank_total_history'}}}) }}
-- The bank total is the same at every syncpoint built (and equals expected_bank_total when
-- set): a build that mixed two moments would show money created or destroyed.
with totals as (
    select distinct total_balance from {{ ref('bank_total_history') }}
)
select total_balance, 'differs between syncpoints' as problem
from totals
where (select count(*) from totals) > 1
{% if var('expected_bank_total') is not none %}
union all
select total_balance, 'differs from expected {{ var("expected_bank_total") }}' as problem
from {{ ref('bank_total') }}
where total_balance <> cast('{{ var("expected_bank_total") }}' as decimal(38, 2))
{% endif %}
