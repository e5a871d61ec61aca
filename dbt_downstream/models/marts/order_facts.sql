-- Orders joined to their customers, both tables at the same syncpoint.
select
    o.order_id,
    o.customer_id,
    c.customer_name,
    o.amount,
    o.status,
    o.placed_at,
    cast(o.placed_at as date) as order_date,
    {{ syncpoint_ts() }} as syncpoint_ts
from {{ ref('stg_orders') }} as o
left join {{ ref('stg_customers') }} as c using (customer_id)
