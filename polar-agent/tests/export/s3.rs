//! Export to an S3-compatible store (moto on loopback): `polar export`
//! with an `s3://` destination and `--s3-endpoint`, credentials from the
//! environment; objects listed and read back. And multipart uploads: not
//! visible before completion, whole after, nothing left on abort.

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{Result, ensure};
use object_store::ObjectStoreExt as _;
use object_store::path::Path as ObjectPath;
use polar_export::object::{ObjectFile, PART_SIZE};
use polar_export::{Destination, S3Options};
use polar_trajectory::Builder;

use crate::fixture;
use crate::moto::{KEY, Moto, REGION, list};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polar_export_to_s3_compatible_storage() -> Result<()> {
    let moto = Moto::start()?;
    moto.create_bucket("rollouts")?;
    let summary = moto.export_fixture("s3://rollouts/runs/1")?;

    let store = moto.client("rollouts")?;
    let names = list(&store).await?;
    ensure!(names.len() == 12, "{names:?}");
    ensure!(
        names.iter().all(|n| n.starts_with("runs/1/task=task-")),
        "{names:?}"
    );
    let mut files = BTreeMap::new();
    let mut bytes = 0u64;
    for n in &names {
        let data = store
            .get(&ObjectPath::from(n.as_str()))
            .await?
            .bytes()
            .await?;
        bytes += data.len() as u64;
        files.insert(n.clone(), data.to_vec());
    }
    ensure!(
        summary["bytes"] == bytes,
        "summary bytes {} != {bytes}",
        summary["bytes"]
    );
    let expected = fixture::expected(&Builder::default())?;
    let (parquet, jsonl): (BTreeMap<_, _>, BTreeMap<_, _>) = files
        .into_iter()
        .partition(|(k, _)| k.ends_with(".parquet"));
    ensure!(
        fixture::decode(&parquet)? == expected,
        "Parquet from S3 differs"
    );
    ensure!(
        fixture::decode(&jsonl)? == expected,
        "JSONL from S3 differs"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multipart_objects_are_invisible_until_complete() -> Result<()> {
    let moto = Moto::start()?;
    moto.create_bucket("parts")?;
    let dest = Destination::parse(
        "s3://parts/x",
        &S3Options {
            endpoint: Some(moto.endpoint()),
            region: Some(REGION.into()),
            access_key_id: Some(KEY.into()),
            secret_access_key: Some(KEY.into()),
            ..S3Options::default()
        },
    )?;
    let Destination::Object { store, .. } = dest else {
        anyhow::bail!("not an object destination");
    };
    let reader = moto.client("parts")?;
    let chunk: Vec<u8> = (0..PART_SIZE / 2).map(|i| (i % 251) as u8).collect();

    let mut file = ObjectFile::create(Arc::clone(&store), ObjectPath::from("x/big.bin"));
    let mut expected = Vec::new();
    for _ in 0..5 {
        file.write(chunk.clone()).await?;
        expected.extend_from_slice(&chunk);
    }
    ensure!(
        list(&reader).await?.is_empty(),
        "a partial object is visible"
    );
    file.commit().await?;
    let got = reader
        .get(&ObjectPath::from("x/big.bin"))
        .await?
        .bytes()
        .await?;
    ensure!(
        got.len() == expected.len() && got == expected.as_slice(),
        "object differs"
    );

    let mut aborted = ObjectFile::create(Arc::clone(&store), ObjectPath::from("x/gone.bin"));
    for _ in 0..3 {
        aborted.write(chunk.clone()).await?;
    }
    aborted.abort().await;
    ensure!(
        list(&reader).await? == ["x/big.bin"],
        "an aborted upload is visible"
    );
    Ok(())
}
