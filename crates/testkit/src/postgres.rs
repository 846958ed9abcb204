//! The PostgreSQL server of the test run, and a throwaway schema per test.
//!
//! The server comes from `DDBPIPE_TEST_POSTGRES_URL`, which `scripts/test.sh` sets (it starts a
//! throwaway server); without it every PostgreSQL test fails, naming the variable. Each test
//! works in its own schema (random name, dropped when the [`TestSchema`] is, also after a failed
//! assertion), so the tests run in parallel.

/// `DDBPIPE_TEST_POSTGRES_URL`.
pub fn url() -> String {
    std::env::var("DDBPIPE_TEST_POSTGRES_URL").unwrap_or_else(|_| {
        panic!(
            "DDBPIPE_TEST_POSTGRES_URL is not set: run the tests with scripts/test.sh, which \
             starts a throwaway PostgreSQL server (or point the variable at a server of yours)"
        )
    })
}

/// A plain connection to the test server, for set-up and for looking at rows.
pub async fn connect() -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(&url(), tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to DDBPIPE_TEST_POSTGRES_URL: {e}"));
    tokio::spawn(connection);
    client
}

/// A fresh schema in the test server, dropped with everything in it when this value is.
#[derive(Debug)]
pub struct TestSchema {
    name: String,
}

impl TestSchema {
    /// Creates a schema named `<prefix>_<random>` through `admin`.
    pub async fn create(admin: &tokio_postgres::Client, prefix: &str) -> Self {
        let name = format!("{prefix}_{:016x}", rand::random::<u64>());
        admin
            .batch_execute(&format!("CREATE SCHEMA \"{name}\""))
            .await
            .unwrap_or_else(|e| panic!("cannot create the test schema {name}: {e}"));
        TestSchema { name }
    }

    /// [`TestSchema::create`] from outside a runtime, on a connection of its own.
    pub fn create_blocking(prefix: &str) -> Self {
        let prefix = prefix.to_string();
        on_own_runtime(|| async move { TestSchema::create(&connect().await, &prefix).await })
    }

    /// The schema's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for TestSchema {
    fn drop(&mut self) {
        // Runs after a failed assertion too, where the test's runtime cannot be used.
        let sql = format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.name);
        on_own_runtime(|| async move {
            // A schema left behind only costs the throwaway server some space.
            let _ = connect().await.batch_execute(&sql).await;
        });
    }
}

/// Runs `work` to its end on a runtime of its own, in a thread of its own (callable from
/// inside another runtime).
fn on_own_runtime<T, F>(work: impl FnOnce() -> F + Send + 'static) -> T
where
    T: Send + 'static,
    F: std::future::Future<Output = T>,
{
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime for the test database")
            .block_on(work())
    })
    .join()
    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}
