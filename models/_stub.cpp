// Temporary stub.
