-- Every bank account of every bank table, at the build's syncpoint: the bank sources the
-- syncpoint has (pinned_sources, set per build), all of them when parsing for the lineage.
{% for t in var('pinned_sources', {}).get('bank', var('bank_tables')) %}
{% if not loop.first %}union all{% endif %}
select
    '{{ t }}' as bank_table,
    '{{ t }}:' || cast(id as varchar) as account_key,
    cast(id as bigint) as account_id,
    cast(balance as decimal(18, 2)) as balance,
    {{ optional_column(source('bank', t), 'owner', 'varchar') }} as owner
from {{ source('bank', t) }}
{% endfor %}
