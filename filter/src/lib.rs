//! proxy-dedup filter glue.
