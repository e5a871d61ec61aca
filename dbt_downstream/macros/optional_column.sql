{#- A column a DDL may drop or rename upstream: its value when the pinned source has it,
    else NULL of the same type, so a build never fails on the workload's DDLs. -#}
{% macro optional_column(relation, name, sql_type) -%}
  {%- set present = [] -%}
  {%- if execute -%}
    {%- for col in adapter.get_columns_in_relation(relation) -%}
      {%- if col.name == name -%}{%- do present.append(col) -%}{%- endif -%}
    {%- endfor -%}
  {%- endif -%}
  {%- if present -%}
    cast({{ adapter.quote(name) }} as {{ sql_type }})
  {%- else -%}
    cast(null as {{ sql_type }})
  {%- endif -%}
{%- endmacro %}

{#- The syncpoint the pinned sources show, from the pin record written with the views
    (not a --vars value: changing vars every build would force dbt to re-parse fully). -#}
{% macro syncpoint_ts() -%}
  (select max(syncpoint_ts) from cdc_meta.pinned_syncpoint)
{%- endmacro %}
