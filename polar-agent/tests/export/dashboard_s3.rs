//! The dashboard's read of exports in S3 (moto on loopback): files that
//! `polar export` wrote to `s3://rollouts/runs/1` read back through
//! `[rollout.dashboard] s3_roots` (HEAD, bounded GET, the export's own
//! decoders, cut to one session) as the rollout server's trajectory
//! endpoint does; an object over the size limit, a missing object and one
//! outside the roots refused. The refusals the server makes before sending
//! anything are tested in the rollout crate (`tests::ui`).

use std::sync::Arc;

use anyhow::{Context as _, Result, ensure};
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt as _};
use polar_export::S3Options;
use polar_rollout::ui::exports::{self, ExportReadError, FileFormat};
use polar_rollout::ui::settings::DashboardSettings;

use crate::moto::{KEY, Moto, REGION, list};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_reads_exports_beneath_its_s3_roots() -> Result<()> {
    let moto = Moto::start()?;
    moto.create_bucket("rollouts")?;
    moto.export_fixture("s3://rollouts/runs/1")?;
    let endpoint = moto.endpoint();

    // What the test reads directly, to compare with.
    let store = moto.client("rollouts")?;
    let names = list(&store).await?;
    ensure!(names.len() == 12, "{names:?}");

    let mut settings = DashboardSettings::default();
    settings.set_s3_roots(
        &["s3://rollouts/runs/1".to_owned()],
        S3Options {
            endpoint: Some(endpoint.clone()),
            region: Some(REGION.into()),
            access_key_id: Some(KEY.into()),
            secret_access_key: Some(KEY.into()),
            ..S3Options::default()
        },
    )?;
    let roots = &settings.s3_roots;
    let max = settings.max_file_bytes;

    for ext in ["parquet", "jsonl"] {
        let name = names
            .iter()
            .find(|n| n.ends_with(&format!(".{ext}")))
            .context("no such export")?;
        let session = name
            .rsplit('/')
            .next()
            .and_then(|f| f.strip_suffix(&format!(".{ext}")))
            .context("a file name")?
            .to_owned();
        let uri = format!("s3://rollouts/{name}");
        let (format, bytes) = exports::fetch_s3(&uri, roots, max).await?;
        ensure!(format.as_str() == ext, "{uri}: {format:?}");
        let direct = store
            .get(&ObjectPath::from(name.as_str()))
            .await?
            .bytes()
            .await?;
        ensure!(bytes == direct, "{uri}: other bytes than the object's");
        let (u, s) = (uri.clone(), session.clone());
        let rows = tokio::task::spawn_blocking(move || {
            exports::decode_session_rows(&u, format, bytes, &s)
        })
        .await??;
        let all = match format {
            FileFormat::Parquet => polar_export::read_parquet(direct)?,
            FileFormat::Jsonl => polar_export::read_jsonl(&direct)?,
            FileFormat::Calls => anyhow::bail!("{uri}: a calls file listed as a trajectory"),
        };
        let want: Vec<_> = all
            .into_iter()
            .filter(|r| r.session_id == session)
            .collect();
        ensure!(!want.is_empty(), "{uri}: no rows of {session}");
        ensure!(rows == want, "{uri}: the rows read differ");
        // Over the limit: refused after the HEAD, with the object's size.
        match exports::fetch_s3(&uri, roots, 64).await {
            Err(ExportReadError::TooLarge { size, max: 64, .. }) => {
                ensure!(
                    size == direct_len(&store, name).await?,
                    "{uri}: size {size}"
                );
            }
            other => anyhow::bail!("{uri} with a 64-byte limit: {other:?}"),
        }
    }
    let missing = "s3://rollouts/runs/1/task=none/none.jsonl";
    match exports::fetch_s3(missing, roots, max).await {
        Err(ExportReadError::Missing { .. }) => {}
        other => anyhow::bail!("{missing}: {other:?}"),
    }
    // Exists, but outside the root: never fetched.
    let outside = format!("s3://rollouts/{}", names[0].replacen("runs/1/", "runs/", 1));
    store
        .put(
            &ObjectPath::from(outside.trim_start_matches("s3://rollouts/")),
            b"{}\n".to_vec().into(),
        )
        .await?;
    match exports::fetch_s3(&outside, roots, max).await {
        Err(ExportReadError::OutsideS3(_)) => {}
        other => anyhow::bail!("{outside}: {other:?}"),
    }
    Ok(())
}

async fn direct_len(store: &Arc<dyn ObjectStore>, name: &str) -> Result<u64> {
    Ok(store.head(&ObjectPath::from(name)).await?.size)
}
