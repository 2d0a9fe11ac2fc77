pub mod tls;
