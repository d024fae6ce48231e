//! Where artifact bytes live. The interface is shaped like an object store (put a whole
//! object, read a byte range of it, delete it, ask its size) so an S3-compatible backend can
//! stand in for [`LocalBlobs`], the one kept under the controller's data dir.

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;

use bytes::Bytes;
use futures_util::Stream;
use tokio::io::{AsyncReadExt, AsyncSeekExt};

/// A stream of an object's bytes.
pub type ByteStream = Pin<Box<dyn Stream<Item = io::Result<Bytes>> + Send>>;

#[async_trait::async_trait]
pub trait BlobStore: Send + Sync {
    /// Stores `file` (a local file the store takes over: it is gone afterwards) as `key`. The
    /// object is visible only once complete: a crash leaves either nothing or all of it.
    async fn put(&self, key: &str, file: &Path) -> io::Result<()>;
    /// Bytes `start..=end` of the object (all of it for `None`), and how many that is.
    async fn open(&self, key: &str, range: Option<(u64, u64)>) -> io::Result<(ByteStream, u64)>;
    /// Removes the object; a missing one is not an error.
    async fn delete(&self, key: &str) -> io::Result<()>;
    /// The object's size, `None` when there is none.
    async fn size(&self, key: &str) -> io::Result<Option<u64>>;
    /// Every key held (to find objects no row names after a crash).
    async fn keys(&self) -> io::Result<Vec<String>>;
    /// A fresh local path to build a file in before `put` (on the store's own file system
    /// for a local store, so `put` is a rename).
    fn scratch(&self) -> io::Result<PathBuf>;
}

/// Objects as files under `<root>/blobs/<key>`, built in `<root>/tmp/`.
pub struct LocalBlobs {
    root: PathBuf,
}

impl LocalBlobs {
    /// Opens (creating) the store at `root`, dropping whatever a crash left half-built.
    pub fn open(root: &Path) -> io::Result<LocalBlobs> {
        let b = LocalBlobs {
            root: root.to_path_buf(),
        };
        std::fs::create_dir_all(b.blobs())?;
        let tmp = b.tmp();
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp)?;
        }
        std::fs::create_dir_all(&tmp)?;
        Ok(b)
    }

    fn blobs(&self) -> PathBuf {
        self.root.join("blobs")
    }

    fn tmp(&self) -> PathBuf {
        self.root.join("tmp")
    }

    fn path(&self, key: &str) -> io::Result<PathBuf> {
        if key.is_empty()
            || key.starts_with('.')
            || !key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("blob key {key:?}"),
            ));
        }
        Ok(self.blobs().join(key))
    }
}

#[async_trait::async_trait]
impl BlobStore for LocalBlobs {
    async fn put(&self, key: &str, file: &Path) -> io::Result<()> {
        let dest = self.path(key)?;
        let tmp = self.tmp();
        let blobs = self.blobs();
        let file = file.to_path_buf();
        tokio::task::spawn_blocking(move || {
            // A file from elsewhere is copied into the store's file system first, so the
            // final step is always one rename there.
            let staged = if file.parent() == Some(tmp.as_path()) {
                file.clone()
            } else {
                let staged = tmp.join(format!("in-{}", crate::util::random_hex(8)));
                std::fs::copy(&file, &staged)?;
                staged
            };
            std::fs::File::open(&staged)?.sync_all()?;
            std::fs::rename(&staged, &dest)?;
            std::fs::File::open(&blobs)?.sync_all()?;
            if staged != file {
                let _ = std::fs::remove_file(&file);
            }
            Ok(())
        })
        .await
        .map_err(io::Error::other)?
    }

    async fn open(&self, key: &str, range: Option<(u64, u64)>) -> io::Result<(ByteStream, u64)> {
        let mut f = tokio::fs::File::open(self.path(key)?).await?;
        let len = f.metadata().await?.len();
        let (start, count) = match range {
            Some((s, e)) if s <= e && e < len => (s, e - s + 1),
            Some(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "range outside the object",
                ));
            }
            None => (0, len),
        };
        f.seek(io::SeekFrom::Start(start)).await?;
        let stream = tokio_util::io::ReaderStream::with_capacity(f.take(count), 64 << 10);
        Ok((Box::pin(stream), count))
    }

    async fn delete(&self, key: &str) -> io::Result<()> {
        match tokio::fs::remove_file(self.path(key)?).await {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }

    async fn size(&self, key: &str) -> io::Result<Option<u64>> {
        match tokio::fs::metadata(self.path(key)?).await {
            Ok(m) => Ok(Some(m.len())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn keys(&self) -> io::Result<Vec<String>> {
        let mut out = Vec::new();
        let mut dir = tokio::fs::read_dir(self.blobs()).await?;
        while let Some(e) = dir.next_entry().await? {
            if let Some(n) = e.file_name().to_str() {
                out.push(n.to_string());
            }
        }
        Ok(out)
    }

    fn scratch(&self) -> io::Result<PathBuf> {
        std::fs::create_dir_all(self.tmp())?;
        Ok(self
            .tmp()
            .join(format!("new-{}", crate::util::random_hex(8))))
    }
}

#[cfg(test)]
mod tests {
    use futures_util::StreamExt;

    use super::*;

    async fn read(b: &LocalBlobs, key: &str, range: Option<(u64, u64)>) -> Vec<u8> {
        let (mut s, n) = b.open(key, range).await.unwrap();
        let mut out = Vec::new();
        while let Some(c) = s.next().await {
            out.extend(c.unwrap());
        }
        assert_eq!(out.len() as u64, n);
        out
    }

    #[tokio::test]
    async fn an_object_is_put_whole_read_by_range_and_deleted() {
        let d = tempfile::tempdir().unwrap();
        let b = LocalBlobs::open(d.path()).unwrap();
        let f = b.scratch().unwrap();
        std::fs::write(&f, b"0123456789").unwrap();
        b.put("art_1", &f).await.unwrap();
        assert!(!f.exists(), "the scratch file was moved in");
        assert_eq!(read(&b, "art_1", None).await, b"0123456789");
        assert_eq!(read(&b, "art_1", Some((2, 4))).await, b"234");
        assert!(b.open("art_1", Some((5, 10))).await.is_err());
        assert_eq!(b.size("art_1").await.unwrap(), Some(10));
        assert_eq!(b.keys().await.unwrap(), ["art_1"]);
        // A file from another directory is copied in and removed.
        let other = d.path().join("elsewhere.bin");
        std::fs::write(&other, b"x").unwrap();
        b.put("art_2", &other).await.unwrap();
        assert!(!other.exists());
        b.delete("art_1").await.unwrap();
        b.delete("art_1").await.unwrap();
        assert_eq!(b.size("art_1").await.unwrap(), None);
        assert!(b.put("../x", &b.scratch().unwrap()).await.is_err());
    }

    #[tokio::test]
    async fn a_file_never_put_is_not_an_object_and_is_dropped_at_open() {
        let d = tempfile::tempdir().unwrap();
        let b = LocalBlobs::open(d.path()).unwrap();
        // Written but never put (the controller died before the rename).
        let f = b.scratch().unwrap();
        std::fs::write(&f, b"half").unwrap();
        assert!(b.keys().await.unwrap().is_empty());
        drop(b);
        let b = LocalBlobs::open(d.path()).unwrap();
        assert!(!f.exists(), "the half-built file is gone");
        assert!(b.keys().await.unwrap().is_empty());
    }
}
