//! rmcp's session store on the cluster's database, so an MCP session opened on one instance
//! continues on another: rmcp writes the client's `initialize` parameters after the handshake,
//! an instance handed a session id it does not hold in memory loads them and replays the
//! handshake, and `DELETE /mcp` forgets them. The state is rmcp's own `SessionState`, kept as
//! JSON in `mcp_sessions` (`store::postgres::mcp_sessions`). A session unused everywhere for
//! [`SESSION_TTL`] is forgotten (expired rows are pruned whenever a session is stored). Only
//! in a cluster; one instance keeps its sessions in memory, as before.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use rmcp::transport::streamable_http_server::session::{
    SessionState, SessionStore, SessionStoreError,
};
use sqlx_postgres::PgPool;
use tracing::{debug, warn};

use crate::store::postgres::mcp_sessions;

/// How long a session nobody loads or re-stores stays known to the cluster.
pub(crate) const SESSION_TTL: Duration = Duration::from_secs(24 * 3600);

/// Why the session store failed.
#[derive(Debug, thiserror::Error)]
enum StoreFailure {
    #[error("the MCP session store (the shared database) failed: {0}")]
    Db(#[from] sqlx_core::Error),
    #[error("a stored MCP session is not valid JSON state: {0}")]
    Json(#[from] serde_json::Error),
}

/// rmcp's [`SessionStore`] on `mcp_sessions`.
pub(crate) struct PgSessionStore {
    pool: PgPool,
    ttl: Duration,
}

impl PgSessionStore {
    pub(crate) fn new(pool: PgPool) -> Self {
        Self {
            pool,
            ttl: SESSION_TTL,
        }
    }

    async fn load_state(&self, id: &str) -> Result<Option<SessionState>, StoreFailure> {
        let Some(text) = mcp_sessions::load(&self.pool, id, self.ttl).await? else {
            return Ok(None);
        };
        Ok(Some(serde_json::from_str(&text)?))
    }

    async fn store_state(&self, id: &str, state: &SessionState) -> Result<(), StoreFailure> {
        let text = serde_json::to_string(state)?;
        mcp_sessions::store(&self.pool, id, &text).await?;
        match mcp_sessions::prune(&self.pool, self.ttl).await {
            Ok(0) => {}
            Ok(n) => debug!(sessions = n, "expired MCP sessions forgotten"),
            Err(e) => warn!(error = %e, "expired MCP sessions not pruned"),
        }
        Ok(())
    }
}

/// The future rmcp's `#[async_trait]` trait expects of each method.
type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, SessionStoreError>> + Send + 'a>>;

// Written out as `#[async_trait]` would expand it (the crate does not depend on async-trait).
impl SessionStore for PgSessionStore {
    fn load<'life0, 'life1, 'async_trait>(
        &'life0 self,
        session_id: &'life1 str,
    ) -> StoreFuture<'async_trait, Option<SessionState>>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(async move { Ok(self.load_state(session_id).await?) })
    }

    fn store<'life0, 'life1, 'life2, 'async_trait>(
        &'life0 self,
        session_id: &'life1 str,
        state: &'life2 SessionState,
    ) -> StoreFuture<'async_trait, ()>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        'life2: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(async move { Ok(self.store_state(session_id, state).await?) })
    }

    fn delete<'life0, 'life1, 'async_trait>(
        &'life0 self,
        session_id: &'life1 str,
    ) -> StoreFuture<'async_trait, ()>
    where
        'life0: 'async_trait,
        'life1: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(async move {
            mcp_sessions::delete(&self.pool, session_id)
                .await
                .map_err(StoreFailure::from)?;
            Ok(())
        })
    }
}
