//! Iceberg's file access through the lake's own ([`Objects`]): the table's metadata, manifests
//! and manifest lists are read and written by the same S3 client (credentials from the AWS
//! chain, the endpoint path-style, errors told without credentials) or directory as its data
//! files.
//!
//! # Rules
//! 1. A path is the warehouse's root (`s3://bucket/prefix/`, an absolute directory) followed by
//!    the object's name; a path outside the warehouse is refused, naming it.
//! 2. A file is written whole when it is closed (`Objects` rule 1), and read whole (metadata
//!    and manifests are small: data files are never read through here).
//! 3. The storage cannot be sent to another process: it serializes as its root, and refuses
//!    to deserialize (Iceberg's storage traits ask for both; ddbpipe plans no remote work).

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use iceberg::io::{
    FileIO, FileIOBuilder, FileMetadata, FileRead, FileWrite, InputFile, OutputFile, Storage,
    StorageConfig, StorageFactory,
};
use iceberg::{Error, ErrorKind, Result};

use crate::objects::Objects;

/// The warehouse's files as Iceberg's storage.
#[derive(Debug, Clone)]
pub struct WarehouseStorage {
    objects: Objects,
    root: String,
}

impl WarehouseStorage {
    /// The storage of `objects`, the warehouse.
    pub fn new(objects: Objects) -> WarehouseStorage {
        let root = objects.name("");
        WarehouseStorage { objects, root }
    }

    /// The `FileIO` Iceberg's writers and readers are given.
    pub fn file_io(&self) -> FileIO {
        FileIOBuilder::new(Arc::new(Factory(self.clone()))).build()
    }

    /// The full path of `name` (rule 1).
    pub fn path(&self, name: &str) -> String {
        format!("{}{name}", self.root)
    }

    /// The name of `path` in the warehouse (rule 1).
    pub fn name<'a>(&self, path: &'a str) -> Result<&'a str> {
        path.strip_prefix(self.root.as_str())
            .or_else(|| {
                path.strip_prefix("file://")
                    .and_then(|p| p.strip_prefix(self.root.as_str()))
            })
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::DataInvalid,
                    format!("{path} is outside the warehouse {}", self.root),
                )
            })
    }

    fn failed(message: String) -> Error {
        Error::new(ErrorKind::Unexpected, message)
    }

    async fn get(&self, path: &str) -> Result<Bytes> {
        let name = self.name(path)?;
        match self.objects.get(name).await.map_err(Self::failed)? {
            Some(bytes) => Ok(Bytes::from(bytes)),
            None => Err(Error::new(
                ErrorKind::DataInvalid,
                format!("{path} does not exist"),
            )),
        }
    }
}

impl serde::Serialize for WarehouseStorage {
    fn serialize<S: serde::Serializer>(
        &self,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.root)
    }
}

impl<'de> serde::Deserialize<'de> for WarehouseStorage {
    fn deserialize<D: serde::Deserializer<'de>>(_: D) -> std::result::Result<Self, D::Error> {
        Err(serde::de::Error::custom(
            "a ddbpipe warehouse storage is not sent between processes",
        ))
    }
}

#[async_trait::async_trait]
#[typetag::serde(name = "ddbpipe-warehouse")]
impl Storage for WarehouseStorage {
    async fn exists(&self, path: &str) -> Result<bool> {
        let name = self.name(path)?;
        Ok(self
            .objects
            .get(name)
            .await
            .map_err(Self::failed)?
            .is_some())
    }

    async fn metadata(&self, path: &str) -> Result<FileMetadata> {
        Ok(FileMetadata {
            size: self.get(path).await?.len() as u64,
        })
    }

    async fn read(&self, path: &str) -> Result<Bytes> {
        self.get(path).await
    }

    async fn reader(&self, path: &str) -> Result<Box<dyn FileRead>> {
        Ok(Box::new(WholeFile(self.get(path).await?)))
    }

    async fn write(&self, path: &str, bs: Bytes) -> Result<()> {
        let name = self.name(path)?;
        self.objects
            .put(name, bs.to_vec())
            .await
            .map_err(Self::failed)
    }

    async fn writer(&self, path: &str) -> Result<Box<dyn FileWrite>> {
        self.name(path)?;
        Ok(Box::new(HeldFile {
            storage: self.clone(),
            path: path.to_string(),
            bytes: Vec::new(),
            closed: false,
        }))
    }

    async fn delete(&self, path: &str) -> Result<()> {
        let name = self.name(path)?;
        self.objects.delete(name).await.map_err(Self::failed)
    }

    async fn delete_prefix(&self, path: &str) -> Result<()> {
        let under = self.name(path)?;
        for name in self.objects.list(under).await.map_err(Self::failed)? {
            self.objects.delete(&name).await.map_err(Self::failed)?;
        }
        Ok(())
    }

    async fn delete_stream(&self, mut paths: BoxStream<'static, String>) -> Result<()> {
        while let Some(path) = paths.next().await {
            self.delete(&path).await?;
        }
        Ok(())
    }

    fn new_input(&self, path: &str) -> Result<InputFile> {
        self.name(path)?;
        Ok(InputFile::new(Arc::new(self.clone()), path.to_string()))
    }

    fn new_output(&self, path: &str) -> Result<OutputFile> {
        self.name(path)?;
        Ok(OutputFile::new(Arc::new(self.clone()), path.to_string()))
    }
}

/// The factory Iceberg's `FileIO` asks for: it hands out the one storage.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Factory(WarehouseStorage);

#[typetag::serde(name = "ddbpipe-warehouse-factory")]
impl StorageFactory for Factory {
    fn build(&self, _config: &StorageConfig) -> Result<Arc<dyn Storage>> {
        Ok(Arc::new(self.0.clone()))
    }
}

/// A file read whole (rule 2).
struct WholeFile(Bytes);

#[async_trait::async_trait]
impl FileRead for WholeFile {
    async fn read(&self, range: Range<u64>) -> Result<Bytes> {
        let (start, end) = (range.start as usize, range.end as usize);
        if start > end || end > self.0.len() {
            return Err(Error::new(
                ErrorKind::DataInvalid,
                format!(
                    "read of bytes {start}..{end} past a file of {}",
                    self.0.len()
                ),
            ));
        }
        Ok(self.0.slice(start..end))
    }
}

/// A file held until it is closed, then written whole (rule 2).
struct HeldFile {
    storage: WarehouseStorage,
    path: String,
    bytes: Vec<u8>,
    closed: bool,
}

#[async_trait::async_trait]
impl FileWrite for HeldFile {
    async fn write(&mut self, bs: Bytes) -> Result<()> {
        self.bytes.extend_from_slice(&bs);
        Ok(())
    }

    async fn close(&mut self) -> Result<()> {
        if std::mem::replace(&mut self.closed, true) {
            return Err(Error::new(
                ErrorKind::Unexpected,
                format!("{} was closed already", self.path),
            ));
        }
        let bytes = Bytes::from(std::mem::take(&mut self.bytes));
        Storage::write(&self.storage, &self.path, bytes).await
    }
}
