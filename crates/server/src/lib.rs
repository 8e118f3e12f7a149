//! warren-server
