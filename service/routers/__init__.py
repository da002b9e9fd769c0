"""The API's routes, one router per area; create_app includes them in the order of the docs."""
