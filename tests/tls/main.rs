//! TLS, mutual TLS and least privilege against real etcd, redis-server and postgres
//! processes, with a throwaway PKI made at test time; every bad input gets a typed error
//! within the connect timeout, and no secret shows in any message.

mod support;

mod etcd;
mod least_privilege;
mod postgres;
mod redis;
mod secrets;
