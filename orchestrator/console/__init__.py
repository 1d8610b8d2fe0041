"""What the operator console shows: one module per page's data, no HTTP and no templates."""
