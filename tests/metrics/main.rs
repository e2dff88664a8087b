//! What the library reports through the `metrics` facade, after real lock operations
//! against real servers, read back from a recording recorder.
//!
//! A binary of its own: the recorder is process-wide, and each test reads only its own
//! backend's series, so that the tests of this binary can run side by side.

mod etcd;
mod postgres;
mod recorded;
mod redis;
mod zookeeper;
