//! The SQLite store's own tests: migrations, the writer's priority, a newer schema refused,
//! calls left open by a crash, unfinished recordings removed at start (the backend-neutral
//! contract is `contract_tests.rs`).

mod basics {
    use super::super::*;

    #[test]
    fn migrations_are_idempotent() {
        let mut c = Connection::open_in_memory().expect("db");
        assert_eq!(migrate(&mut c).expect("migrate"), MIGRATIONS.len());
        assert_eq!(migrate(&mut c).expect("again"), MIGRATIONS.len());
        let v: i64 = c
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .expect("version");
        assert_eq!(v as usize, MIGRATIONS.len());
    }

    /// The writer thread runs at nice `WRITER_NICE` (read back from /proc, as `ps` would).
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn the_writer_thread_yields_to_the_runtime() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(dir.path(), 0, 16).expect("open");
        // A flush is answered by the writer loop, so the thread has lowered its priority.
        store.tx.flush().await.expect("flush");
        let mut seen = 0;
        for t in std::fs::read_dir("/proc/self/task")
            .expect("tasks")
            .flatten()
        {
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            if comm.trim() != "patterd-store" {
                continue;
            }
            let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else {
                continue; // a writer of another test, gone meanwhile
            };
            // Fields after the ")" that closes the name: state is 3rd, nice the 19th.
            let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
            let nice: i32 = rest
                .split_whitespace()
                .nth(16)
                .and_then(|n| n.parse().ok())
                .expect("nice field");
            // Other tests' writers may be so new they have not lowered theirs yet (0).
            assert!(nice == writer::WRITER_NICE || nice == 0, "{stat}");
            seen += usize::from(nice == writer::WRITER_NICE);
        }
        assert!(
            seen >= 1,
            "no patterd-store thread at nice {}",
            writer::WRITER_NICE
        );
        drop(store);
    }

    #[test]
    fn a_newer_schema_refuses_to_open() {
        let dir = tempfile::tempdir().expect("tempdir");
        drop(Store::open(dir.path(), 0, 16).expect("open"));
        let c = Connection::open(dir.path().join(DB_FILE)).expect("db");
        c.execute_batch(&format!("PRAGMA user_version = {}", MIGRATIONS.len() + 1))
            .expect("bump");
        drop(c);
        match Store::open(dir.path(), 0, 16) {
            Err(e @ StoreError::TooNew { .. }) => {
                assert!(e.to_string().contains("newer than this patterd"), "{e}")
            }
            Err(e) => panic!("wrong error: {e}"),
            Ok(_) => panic!("a newer schema was opened"),
        }
    }
}

mod restart {
    use super::super::*;

    #[tokio::test]
    async fn calls_left_open_by_a_crash_are_closed_as_failed_on_restart() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(dir.path(), 0, 16).expect("open");
        store.tx.send(Write::Call(NewCall {
            call_id: "CA1".into(),
            carrier: "twilio".into(),
            carrier_account: "twilio".into(),
            direction: "inbound",
            from: "+15550001111".into(),
            to: "+15550002222".into(),
            agent: "a".into(),
            status: "in-progress".into(),
        }));
        store.tx.flush().await.expect("flush");
        let open = store.call("CA1").await.expect("read").expect("row");
        assert_eq!(open.status, "in-progress");
        drop(store);
        let again = Store::open(dir.path(), 0, 16).expect("reopen");
        let row = again.call("CA1").await.expect("read").expect("row");
        assert_eq!(row.status, "failed");
        assert!(row.ended_at.is_some());
    }
}

mod parts {
    use super::super::*;

    /// A crash leaves `<call_id>.wav.part` behind: the next start removes it (no call is live
    /// then), keeping finished recordings and whatever else the directory holds.
    #[test]
    fn unfinished_recordings_left_by_a_crash_are_removed_at_start() {
        let dir = tempfile::tempdir().expect("tempdir");
        let recordings = dir.path().join("recordings");
        crate::util::create_private_dir(&recordings).expect("dir");
        for name in ["CA1.wav.part", "v3:abc.wav.part", "CA2.wav", "notes.txt"] {
            std::fs::write(recordings.join(name), b"RIFF").expect("write");
        }
        std::fs::create_dir(recordings.join("sub.wav.part")).expect("a directory");
        let store = Store::open(dir.path(), 0, 16).expect("open");
        let mut left: Vec<String> = std::fs::read_dir(&recordings)
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["CA2.wav", "notes.txt", "sub.wav.part"]);
        drop(store);
        // Nothing to do the next time (and no recordings directory is fine too).
        assert_eq!(crate::call::recording::prune_parts(dir.path()), 0);
        assert_eq!(
            crate::call::recording::prune_parts(&dir.path().join("none")),
            0
        );
    }
}
