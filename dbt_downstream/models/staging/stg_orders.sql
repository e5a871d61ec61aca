-- status and placed_at may be dropped or renamed by upstream DDLs: NULL then.
select
    cast(id as bigint) as order_id,
    cast(customer_id as bigint) as customer_id,
    cast(amount as decimal(12, 2)) as amount,
    {{ optional_column(source('shop', 'orders'), 'status', 'varchar') }} as status,
    {{ optional_column(source('shop', 'orders'), 'placed_at', 'timestamp') }} as placed_at
from {{ source('shop', 'orders') }}
