//! Writing `plexd bugreport`'s entries as a tar.gz (0600: it describes the host).

use std::path::Path;

use flate2::Compression;
use flate2::write::GzEncoder;

use super::bugreport::Entry;

/// The folder every entry sits in inside the tarball.
pub(crate) const TOP_DIR: &str = "plexd-bugreport";

/// Writes `entries` to `path` (created 0600, replaced if it exists); answers its size.
pub fn write(path: &Path, entries: &[Entry], mtime: u64) -> Result<u64, String> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let what = |e: std::io::Error| format!("cannot write {}: {e}", path.display());
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(what)?;
    let mut tar = tar::Builder::new(GzEncoder::new(file, Compression::default()));
    for e in entries {
        let mut header = tar::Header::new_gnu();
        header.set_size(e.bytes.len() as u64);
        header.set_mode(0o600);
        header.set_mtime(mtime);
        header.set_cksum();
        tar.append_data(
            &mut header,
            format!("{TOP_DIR}/{}", e.name),
            e.bytes.as_slice(),
        )
        .map_err(what)?;
    }
    let gz = tar.into_inner().map_err(what)?;
    let file = gz.finish().map_err(what)?;
    file.sync_all().map_err(what)?;
    Ok(file.metadata().map_err(what)?.len())
}

/// The entries of a tarball [`write`] made (tests and `plexd bugreport`'s own check).
pub fn read(path: &Path) -> Result<Vec<Entry>, String> {
    use std::io::Read as _;
    let what = |e: std::io::Error| format!("cannot read {}: {e}", path.display());
    let file = std::fs::File::open(path).map_err(what)?;
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(file));
    let mut out = Vec::new();
    for entry in archive.entries().map_err(what)? {
        let mut entry = entry.map_err(what)?;
        let name = entry.path().map_err(what)?.to_string_lossy().into_owned();
        let mut bytes = Vec::new();
        entry.read_to_end(&mut bytes).map_err(what)?;
        out.push(Entry { name, bytes });
    }
    Ok(out)
}
