//! patterd as a cluster: real `patterd` processes on one PostgreSQL database behind a
//! round-robin front (`tests/common/cluster.rs`). Each scenario is its own file. Without
//! PostgreSQL every test here says why and passes; CI sets `PATTERD_REQUIRE_POSTGRES=1`, which
//! makes that a failure.

#[path = "../common/mod.rs"]
mod common;

mod drain;
mod fence;
mod forward;
mod k8s_pod;
mod kill;
mod mcp;
mod migrate;
mod roster;
mod shared_state;
mod webhooks;
