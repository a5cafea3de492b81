"""The append-only privacy budget ledger."""
