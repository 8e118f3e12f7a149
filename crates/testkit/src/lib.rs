//! warren-testkit
