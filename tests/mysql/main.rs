//! Tests of the MariaDB/MySQL fenced-write helpers against a real MariaDB (Debian's
//! `mariadb-server`, started by the testkit as a process), and the end-to-end
//! stale-holder story through etcd tokens. The tests share one server (each with its own
//! database); the ones that need another server (TLS) start their own.

mod support;

mod abandoned_begin;
mod abandoned_statement;
mod commit_unknown;
mod concurrent_writers;
mod connect_errors;
mod idempotency;
mod invalid_input;
mod narrow_token_column;
mod server_version;
mod single_statement;
mod stale_holder;
mod stale_token;
mod tls;
mod token_column_databases;
mod transaction_ended;
mod version_cas;
