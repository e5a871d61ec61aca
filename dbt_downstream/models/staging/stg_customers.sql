select
    cast(id as bigint) as customer_id,
    name as customer_name,
    {{ optional_column(source('shop', 'customers'), 'email', 'varchar') }} as email
from {{ source('shop', 'customers') }}
