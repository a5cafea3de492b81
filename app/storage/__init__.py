"""Raw-data and artifact stores (encrypted raw files, Parquet/CSV artifacts)."""
