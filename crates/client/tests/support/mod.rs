pub mod host_agent;
