-- One row per syncpoint built: the bank total at each (the singular test checks it is constant).
{{ config(materialized='incremental', unique_key='syncpoint_ts', incremental_strategy='delete+insert') }}
select syncpoint_ts, n_accounts, total_balance, current_timestamp as built_at
from {{ ref('bank_total') }}
