//! warren-proto
