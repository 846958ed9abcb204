//! Mirror a table into PostgreSQL: the table's items as rows, kept equal to the table by its
//! stream, the position in the same database.
//!
//! ```text
//! DATABASE_URL=postgres://localhost/app cargo run --example mirror_into_postgres -- orders http://127.0.0.1:8000
//! ```
//!
//! Without `DATABASE_URL` it says so and exits: there is nothing to mirror into.

/// Mirrors `table` at `endpoint` (`None`: AWS as the environment says) into the PostgreSQL
/// database at `url`, schema `schema`, until no change came for 2 s.
pub async fn mirror(
    table: &str,
    endpoint: Option<&str>,
    url: &str,
    schema: &str,
) -> Result<ddbpipe::Summary, ddbpipe::Error> {
    let endpoint = endpoint.map_or(String::new(), |url| {
        format!(
            "  endpoint_url: {url}\n  region: us-east-1\n  credentials: {{type: access_key, \
             config: {{access_key_id: local, secret_access_key: local}}}}\n"
        )
    });
    // A password in the URL is never printed: messages name the host and database only.
    let url = url.replace('\'', "''");
    let yaml = format!(
        "name: mirror-{table}\nsource:\n  table_name: {table}\n  mode: mirror\n  \
         idle_termination_secs: 2\n{endpoint}sink:\n  type: postgres\n  \
         url: '{url}'\n  schema: {schema}\n"
    );
    let dir = std::env::current_dir().unwrap_or_default();
    ddbpipe::Pipeline::from_yaml(&yaml, dir)?
        .run(ddbpipe::Cancel::never())
        .await
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let table = args
        .next()
        .ok_or("usage: mirror_into_postgres TABLE [ENDPOINT]")?;
    let Ok(url) = std::env::var("DATABASE_URL") else {
        println!("DATABASE_URL is not set: no PostgreSQL to mirror into, nothing done");
        return Ok(());
    };
    let summary = mirror(&table, args.next().as_deref(), &url, "public").await?;
    println!("{summary}");
    Ok(())
}
