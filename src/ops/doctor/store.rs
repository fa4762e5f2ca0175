//! Doctor's store check: with `[store] backend = "postgres"`, the database at `store.url` is
//! reached (without migrating or writing anything) and its schema version compared with the one
//! this patterd knows. The embedded SQLite store needs no check (`patterd check` covers its
//! directory).

use super::Finding;
use crate::carrier::registry::BoxFuture;
use crate::config::Config;
use crate::config::schema::StoreBackend;

pub(super) fn check(config: &Config) -> Option<BoxFuture<Vec<Finding>>> {
    if config.store.backend != StoreBackend::Postgres {
        return None;
    }
    let url = config.store.url.as_ref()?.expose().to_string();
    Some(Box::pin(async move {
        let shown = crate::store::redact_url(&url);
        vec![match crate::store::probe_postgres(&url).await {
            Ok((_, schema, supported)) if schema > supported => Finding::StoreSchemaTooNew {
                url: shown,
                schema,
                supported,
            },
            Ok((server, schema, _)) => Finding::StoreReachable {
                url: shown,
                server,
                schema,
            },
            Err(error) => Finding::StoreUnreachable { url: shown, error },
        }]
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::util::secret::Secret;

    fn postgres_config(url: &str) -> Config {
        let mut c = Config::default();
        c.store.backend = StoreBackend::Postgres;
        c.store.url = Some(Secret::new(url));
        c
    }

    #[tokio::test]
    async fn a_reachable_database_is_reported_with_its_schema_and_left_unchanged() {
        let Some(db) = patterd_sim::postgres::TestDatabase::create() else {
            return;
        };
        let found = check(&postgres_config(&db.url)).expect("a check").await;
        match found.as_slice() {
            [
                Finding::StoreReachable {
                    schema: 0, server, ..
                },
            ] => {
                assert!(
                    server.chars().next().is_some_and(|c| c.is_ascii_digit()),
                    "{server}"
                )
            }
            other => panic!("{other:?}"),
        }
        // Doctor migrates nothing.
        assert_eq!(
            db.query("SELECT COUNT(*) FROM pg_tables WHERE schemaname = 'public'"),
            "0"
        );
    }

    #[tokio::test]
    async fn an_unreachable_database_fails_without_showing_its_password() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("port")
            .port();
        let url = format!("postgres://patterd:hunter2@127.0.0.1:{port}/calls");
        let found = check(&postgres_config(&url)).expect("a check").await;
        let [f @ Finding::StoreUnreachable { url, .. }] = found.as_slice() else {
            panic!("{found:?}");
        };
        assert_eq!(f.level(), super::super::Level::Fail);
        assert!(
            url.contains("***") && !f.message().contains("hunter2"),
            "{}",
            f.message()
        );
        assert!(f.fix().is_some_and(|x| x.contains("[store] url")));
    }

    #[tokio::test]
    async fn a_database_from_a_newer_patterd_fails() {
        let Some(db) = patterd_sim::postgres::TestDatabase::create() else {
            return;
        };
        db.query(
            "CREATE TABLE _sqlx_migrations (version BIGINT PRIMARY KEY, success BOOLEAN NOT NULL);
             INSERT INTO _sqlx_migrations VALUES (99, TRUE)",
        );
        let found = check(&postgres_config(&db.url)).expect("a check").await;
        let [f @ Finding::StoreSchemaTooNew { schema: 99, .. }] = found.as_slice() else {
            panic!("{found:?}");
        };
        assert!(
            f.message().contains("newer than this patterd"),
            "{}",
            f.message()
        );
    }

    #[test]
    fn the_sqlite_store_needs_no_check() {
        assert!(check(&Config::default()).is_none());
    }
}
