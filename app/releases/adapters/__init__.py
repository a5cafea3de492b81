"""The release types the service offers; importing this package registers them."""
