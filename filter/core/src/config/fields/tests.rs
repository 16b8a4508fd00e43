//! Tests of the field table against the parser.
