-- Orders per day (order_date is NULL while placed_at is absent upstream).
select
    order_date,
    count(*) as n_orders,
    count(distinct customer_id) as n_customers,
    sum(amount) as revenue,
    {{ syncpoint_ts() }} as syncpoint_ts
from {{ ref('order_facts') }}
group by order_date
