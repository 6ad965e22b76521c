//! The GGUF header parser: magic, version, metadata and tensor table of one
//! file, as a pure function over its bytes. Every count and length is checked
//! against the bytes that remain before anything is allocated, so no input can
//! make it panic, loop for long or allocate more than a small multiple of the
//! input size.

use super::{
    GgufError, MetaType, MetaValue, Metadata, TensorInfo, GGML_MAX_DIMS, GGUF_DEFAULT_ALIGNMENT,
    GGUF_MAGIC, KEY_ALIGNMENT,
};
use crate::tensor::GgmlType;
use std::collections::HashSet;

/// Deepest nesting of arrays inside arrays the reader accepts (llama.cpp
/// accepts none; the GGUF spec allows them).
pub(crate) const MAX_ARRAY_DEPTH: usize = 8;

/// The parsed header of one GGUF file.
#[derive(Clone, Debug, PartialEq)]
pub struct Header {
    /// GGUF version (2 or 3).
    pub version: u32,
    /// Key/value metadata in file order.
    pub metadata: Metadata,
    /// Tensor table in file order, with `shard` 0 and absolute offsets.
    pub tensors: Vec<TensorInfo>,
    /// Data alignment (`general.alignment`, default 32).
    pub alignment: u64,
    /// Absolute offset of the data section (end of the tensor table, aligned).
    pub data_offset: u64,
}

/// Parses the header and tensor table of a GGUF file.
///
/// `bytes` must be the whole file: every tensor's byte range is checked to lie
/// inside it ([`GgufError::TensorOutOfBounds`] otherwise). Supports GGUF v2 and
/// v3, little-endian.
pub fn parse_header(bytes: &[u8]) -> Result<Header, GgufError> {
    let mut c = Cursor { buf: bytes, pos: 0 };

    let magic = c.take(4, || "the magic bytes".into())?;
    if magic != GGUF_MAGIC {
        return Err(GgufError::BadMagic {
            found: magic.to_vec(),
        });
    }
    let version = c.u32(|| "the version".into())?;
    if version != 0 && version & 0xffff == 0 {
        return Err(GgufError::BigEndian { version });
    }
    if !(2..=3).contains(&version) {
        return Err(GgufError::UnsupportedVersion { version });
    }

    let n_tensors = c.count("the tensor count", 24)?;
    let n_kv = c.count("the metadata key count", 13)?;

    let mut metadata = Metadata::new();
    // Look-ups in `Metadata` are linear; a set keeps many keys O(n).
    let mut keys = HashSet::with_capacity(n_kv as usize);
    for index in 0..n_kv {
        let key_at = c.pos;
        let key = c.string(|| format!("metadata key #{index}"))?;
        let key = into_utf8(key, "a metadata key", key_at)?;
        if key.is_empty() {
            return Err(GgufError::EmptyKey { index });
        }
        if !keys.insert(key.clone()) {
            return Err(GgufError::DuplicateKey { key });
        }
        let ty = c.meta_type(&key)?;
        let value = c.value(&key, ty, 0)?;
        metadata.push_new(key, value);
    }

    let alignment = alignment_of(&metadata)?;

    let mut tensors = Vec::with_capacity(n_tensors as usize);
    let mut rel_offsets = Vec::with_capacity(n_tensors as usize);
    let mut seen = HashSet::with_capacity(n_tensors as usize);
    for index in 0..n_tensors {
        let (info, rel) = c.tensor_info(index)?;
        if !seen.insert(info.name.clone()) {
            return Err(GgufError::DuplicateTensor { name: info.name });
        }
        tensors.push(info);
        rel_offsets.push(rel);
    }

    // The data section starts at the next multiple of the alignment. The
    // addition cannot overflow: pos <= bytes.len() and alignment < 2^32.
    let data_offset = (c.pos as u64).next_multiple_of(alignment);
    let file_len = bytes.len() as u64;
    let mut ends = Vec::with_capacity(tensors.len());
    for (t, rel) in tensors.iter_mut().zip(rel_offsets) {
        if rel % alignment != 0 {
            return Err(GgufError::Misaligned {
                name: t.name.clone(),
                offset: rel,
                alignment,
            });
        }
        let end = data_offset
            .checked_add(rel)
            .and_then(|o| Some((o, o.checked_add(t.len)?)));
        // A start past the end of the file is this tensor's own fault; an
        // end past it may be an overlap, told apart below.
        let Some((offset, end)) = end.filter(|&(o, _)| o <= file_len) else {
            return Err(GgufError::TensorOutOfBounds {
                name: t.name.clone(),
                offset: data_offset.saturating_add(rel),
                len: t.len,
                file_len,
            });
        };
        t.offset = offset;
        ends.push(end);
    }
    // Order and overlap before the ends: a tensor retyped to a larger type
    // runs into the next one, which says more than "past the end of the file".
    for (i, pair) in tensors.windows(2).enumerate() {
        check_order(&pair[0], ends[i], &pair[1])?;
    }
    for (t, &end) in tensors.iter().zip(&ends) {
        if end > file_len {
            return Err(GgufError::TensorOutOfBounds {
                name: t.name.clone(),
                offset: t.offset,
                len: t.len,
                file_len,
            });
        }
    }

    Ok(Header {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}

/// Tensor data lies in table order without overlap: `t` must start at or
/// after `prev_end`, the end of the tensor before it. llama.cpp's
/// `gguf_init` is stricter (each tensor exactly at the previous one's
/// padded end); a gap is harmless, so it is allowed here. Only byte ranges
/// are compared; what the bytes mean is not this layer's business.
fn check_order(prev: &TensorInfo, prev_end: u64, t: &TensorInfo) -> Result<(), GgufError> {
    if t.offset >= prev_end {
        Ok(())
    } else if t.offset >= prev.offset {
        Err(GgufError::TensorOverlap {
            name: prev.name.clone(),
            offset: prev.offset,
            len: prev.len,
            next: t.name.clone(),
            next_offset: t.offset,
        })
    } else {
        Err(GgufError::TensorOutOfOrder {
            name: t.name.clone(),
            offset: t.offset,
            previous: prev.name.clone(),
            previous_offset: prev.offset,
        })
    }
}

/// `general.alignment`, or the default; a nonzero power of two below 2^32.
pub(crate) fn alignment_of(metadata: &Metadata) -> Result<u64, GgufError> {
    let Some(v) = metadata.get(KEY_ALIGNMENT) else {
        return Ok(GGUF_DEFAULT_ALIGNMENT);
    };
    let a = v.as_i128().ok_or_else(|| GgufError::WrongType {
        key: KEY_ALIGNMENT.into(),
        expected: "u32",
        found: format!("{:?}", v.meta_type()),
    })?;
    match u32::try_from(a) {
        Ok(a) if a.is_power_of_two() => Ok(a as u64),
        _ => Err(GgufError::BadAlignment {
            alignment: a.clamp(0, u64::MAX as i128) as u64,
        }),
    }
}

fn into_utf8(bytes: &[u8], what: &str, offset: usize) -> Result<String, GgufError> {
    String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::InvalidUtf8 {
        what: what.into(),
        offset: offset as u64,
    })
}

/// A bounds-checked little-endian reader over a byte slice.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// The next `n` bytes; `what` names the field for the error message.
    fn take(&mut self, n: usize, what: impl FnOnce() -> String) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                what: what(),
                offset: self.pos as u64,
            });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(
        &mut self,
        what: impl FnOnce() -> String,
    ) -> Result<[u8; N], GgufError> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u8(&mut self, what: impl FnOnce() -> String) -> Result<u8, GgufError> {
        Ok(self.array::<1>(what)?[0])
    }
    fn u16(&mut self, what: impl FnOnce() -> String) -> Result<u16, GgufError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    fn u32(&mut self, what: impl FnOnce() -> String) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    fn u64(&mut self, what: impl FnOnce() -> String) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A u64 count of items each taking at least `min_item_bytes`; rejected
    /// when the remaining bytes cannot hold that many (also bounds allocations).
    fn count(&mut self, what: &str, min_item_bytes: u64) -> Result<u64, GgufError> {
        let offset = self.pos as u64;
        let n = self.u64(|| what.into())?;
        let remaining = self.remaining() as u64;
        if n.checked_mul(min_item_bytes).is_none_or(|b| b > remaining) {
            return Err(GgufError::ImplausibleCount {
                what: what.into(),
                count: n,
                offset,
                remaining,
            });
        }
        Ok(n)
    }

    /// A GGUF string: u64 length, then that many bytes.
    fn string(&mut self, what: impl Fn() -> String) -> Result<&'a [u8], GgufError> {
        let len = self.count(&format!("length of {}", what()), 1)?;
        // `count` checked len <= remaining, so it fits in usize.
        self.take(len as usize, what)
    }

    fn meta_type(&mut self, key: &str) -> Result<MetaType, GgufError> {
        let id = self.u32(|| format!("the type of metadata key `{key}`"))?;
        MetaType::from_u32(id).ok_or_else(|| GgufError::UnknownMetaType {
            key: key.into(),
            id,
        })
    }

    /// One value of type `ty` (for arrays: element type, count, elements).
    fn value(&mut self, key: &str, ty: MetaType, depth: usize) -> Result<MetaValue, GgufError> {
        let what = || format!("the value of metadata key `{key}`");
        Ok(match ty {
            MetaType::U8 => MetaValue::U8(self.u8(what)?),
            MetaType::I8 => MetaValue::I8(self.u8(what)? as i8),
            MetaType::U16 => MetaValue::U16(self.u16(what)?),
            MetaType::I16 => MetaValue::I16(self.u16(what)? as i16),
            MetaType::U32 => MetaValue::U32(self.u32(what)?),
            MetaType::I32 => MetaValue::I32(self.u32(what)? as i32),
            MetaType::F32 => MetaValue::F32(f32::from_bits(self.u32(what)?)),
            MetaType::Bool => MetaValue::Bool(self.u8(what)? != 0),
            MetaType::U64 => MetaValue::U64(self.u64(what)?),
            MetaType::I64 => MetaValue::I64(self.u64(what)? as i64),
            MetaType::F64 => MetaValue::F64(f64::from_bits(self.u64(what)?)),
            // Values are decoded leniently: a vocabulary entry with invalid
            // UTF-8 becomes U+FFFD instead of making the model unloadable.
            MetaType::String => {
                MetaValue::String(String::from_utf8_lossy(self.string(what)?).into_owned())
            }
            MetaType::Array => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(GgufError::NestingTooDeep {
                        key: key.into(),
                        max: MAX_ARRAY_DEPTH,
                    });
                }
                let elem = self.meta_type(key)?;
                let min = match elem {
                    MetaType::U8 | MetaType::I8 | MetaType::Bool => 1,
                    MetaType::U16 | MetaType::I16 => 2,
                    MetaType::U32 | MetaType::I32 | MetaType::F32 => 4,
                    MetaType::U64 | MetaType::I64 | MetaType::F64 | MetaType::String => 8,
                    MetaType::Array => 12,
                };
                let n = self.count(&format!("the array length of metadata key `{key}`"), min)?;
                let mut items = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    items.push(self.value(key, elem, depth + 1)?);
                }
                MetaValue::Array(elem, items)
            }
        })
    }

    /// One tensor-table entry; returns the info (offset not yet resolved) and
    /// its offset relative to the data section.
    fn tensor_info(&mut self, index: u64) -> Result<(TensorInfo, u64), GgufError> {
        let name_at = self.pos;
        let name = self.string(|| format!("the name of tensor #{index}"))?;
        let name = into_utf8(name, "a tensor name", name_at)?;
        let n_dims = self.u32(|| format!("the dimension count of tensor `{name}`"))? as u64;
        if n_dims > GGML_MAX_DIMS as u64 {
            return Err(GgufError::TooManyDims { name, n_dims });
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(self.u64(|| format!("the shape of tensor `{name}`"))?);
        }
        let id = self.u32(|| format!("the type of tensor `{name}`"))?;
        let rel = self.u64(|| format!("the data offset of tensor `{name}`"))?;

        let Some(ty) = GgmlType::from_u32(id) else {
            return Err(GgufError::UnknownType { name, id });
        };
        let len = tensor_bytes(&name, &dims, ty)?;
        let info = TensorInfo {
            name,
            dims,
            ty,
            shard: 0,
            offset: 0,
            len,
        };
        Ok((info, rel))
    }
}

/// Bytes of a tensor of shape `dims` and type `ty`, with ggml's checks: each
/// dimension and the element count below 2^63, rows a whole number of blocks.
pub(crate) fn tensor_bytes(name: &str, dims: &[u64], ty: GgmlType) -> Result<u64, GgufError> {
    let overflow = || GgufError::DimOverflow { name: name.into() };
    if dims.iter().any(|&d| d > i64::MAX as u64) {
        return Err(overflow());
    }
    if !dims.contains(&0) {
        let n = dims
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .ok_or_else(overflow)?;
        if n > i64::MAX as u64 {
            return Err(overflow());
        }
    }
    let row_len = dims.first().copied().unwrap_or(1);
    if row_len % ty.block_size() as u64 != 0 {
        return Err(GgufError::BadBlockMultiple {
            name: name.into(),
            ty,
            row_len,
            block_size: ty.block_size(),
        });
    }
    if dims.contains(&0) {
        return Ok(0);
    }
    let row = ty.row_bytes(row_len).ok_or_else(overflow)?;
    dims.iter()
        .skip(1)
        .try_fold(row, |a, &d| a.checked_mul(d))
        .ok_or_else(overflow)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn minimal(version: u32, n_tensors: u64, n_kv: u64) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend(version.to_le_bytes());
        b.extend(n_tensors.to_le_bytes());
        b.extend(n_kv.to_le_bytes());
        b
    }

    #[test]
    fn empty_v3_and_v2_parse() {
        for v in [2, 3] {
            let h = parse_header(&minimal(v, 0, 0)).unwrap();
            assert_eq!(h.version, v);
            assert!(h.metadata.is_empty() && h.tensors.is_empty());
            assert_eq!(h.alignment, 32);
            assert_eq!(h.data_offset, 32);
        }
    }

    #[test]
    fn versions_and_endianness() {
        let e = parse_header(&minimal(1, 0, 0)).unwrap_err();
        assert!(matches!(e, GgufError::UnsupportedVersion { version: 1 }));
        let e = parse_header(&minimal(4, 0, 0)).unwrap_err();
        assert!(matches!(e, GgufError::UnsupportedVersion { version: 4 }));
        let e = parse_header(&minimal(3u32.swap_bytes(), 0, 0)).unwrap_err();
        assert!(matches!(e, GgufError::BigEndian { .. }), "{e}");
        assert!(e.to_string().contains("big-endian"));
        let e = parse_header(b"GGML\x03\0\0\0").unwrap_err();
        assert!(matches!(e, GgufError::BadMagic { .. }));
    }

    #[test]
    fn absurd_counts_fail_before_allocating() {
        let e = parse_header(&minimal(3, u64::MAX, 0)).unwrap_err();
        assert!(matches!(e, GgufError::ImplausibleCount { .. }), "{e}");
        let e = parse_header(&minimal(3, 0, 1 << 40)).unwrap_err();
        assert!(matches!(e, GgufError::ImplausibleCount { .. }), "{e}");
        // One key whose array claims 2^60 u64 elements.
        let mut b = minimal(3, 0, 1);
        b.extend(1u64.to_le_bytes());
        b.push(b'k');
        b.extend(9u32.to_le_bytes());
        b.extend(10u32.to_le_bytes());
        b.extend((1u64 << 60).to_le_bytes());
        b.extend([0u8; 64]);
        let e = parse_header(&b).unwrap_err();
        assert!(matches!(e, GgufError::ImplausibleCount { .. }), "{e}");
    }

    #[test]
    fn many_keys_parse_in_linear_time() {
        let n = 200_000u64;
        let mut b = minimal(3, 0, n);
        for i in 0..n {
            let k = format!("k{i}");
            b.extend((k.len() as u64).to_le_bytes());
            b.extend(k.as_bytes());
            b.extend(0u32.to_le_bytes());
            b.push(i as u8);
        }
        // Quadratic duplicate checks would take minutes here.
        let h = parse_header(&b).unwrap();
        assert_eq!(h.metadata.len(), n as usize);
        // A duplicate key is an error.
        b.extend(2u64.to_le_bytes());
        b.extend(b"k7");
        b[16..24].copy_from_slice(&(n + 1).to_le_bytes());
        b.extend(0u32.to_le_bytes());
        b.push(0);
        let e = parse_header(&b).unwrap_err();
        assert!(matches!(e, GgufError::DuplicateKey { .. }), "{e}");
    }

    #[test]
    fn deep_nesting_is_rejected() {
        let mut b = minimal(3, 0, 1);
        b.extend(1u64.to_le_bytes());
        b.push(b'k');
        b.extend(9u32.to_le_bytes());
        for _ in 0..1000 {
            b.extend(9u32.to_le_bytes());
            b.extend(1u64.to_le_bytes());
        }
        let e = parse_header(&b).unwrap_err();
        assert!(matches!(e, GgufError::NestingTooDeep { .. }), "{e}");
    }

    #[test]
    fn tensor_bytes_checks() {
        assert_eq!(tensor_bytes("t", &[256, 3], GgmlType::Q4_K).unwrap(), 432);
        assert_eq!(tensor_bytes("t", &[4, 0], GgmlType::F32).unwrap(), 0);
        assert_eq!(
            tensor_bytes("t", &[4, 0, 1 << 62, 4], GgmlType::F32).unwrap(),
            0
        );
        assert_eq!(tensor_bytes("t", &[], GgmlType::F16).unwrap(), 2);
        assert!(matches!(
            tensor_bytes("t", &[100, 2], GgmlType::Q4_K),
            Err(GgufError::BadBlockMultiple { .. })
        ));
        assert!(matches!(
            tensor_bytes("t", &[1 << 32, 1 << 32], GgmlType::F32),
            Err(GgufError::DimOverflow { .. })
        ));
        // Element count fits in 63 bits but the byte size does not.
        assert!(matches!(
            tensor_bytes("t", &[1 << 31, 1 << 31], GgmlType::F64),
            Err(GgufError::DimOverflow { .. })
        ));
        assert!(matches!(
            tensor_bytes("t", &[u64::MAX], GgmlType::I8),
            Err(GgufError::DimOverflow { .. })
        ));
    }

    /// A file of F32 tensors `(name, elements, data offset)` and `data` bytes.
    fn with_tensors(tensors: &[(&str, u64, u64)], data: usize) -> Vec<u8> {
        let mut b = minimal(3, tensors.len() as u64, 0);
        for (name, n, rel) in tensors {
            b.extend((name.len() as u64).to_le_bytes());
            b.extend(name.as_bytes());
            b.extend(1u32.to_le_bytes());
            b.extend(n.to_le_bytes());
            b.extend(0u32.to_le_bytes());
            b.extend(rel.to_le_bytes());
        }
        b.resize(b.len().next_multiple_of(32) + data, 0);
        b
    }

    #[test]
    fn tensor_ranges_must_ascend_without_overlap() {
        // In order, with a gap and an empty tensor: fine.
        let ok = with_tensors(&[("a", 8, 0), ("e", 0, 32), ("b", 8, 64)], 96);
        assert_eq!(parse_header(&ok).unwrap().tensors.len(), 3);
        // `a` (64 bytes) runs into `b` at 32.
        let e = parse_header(&with_tensors(&[("a", 16, 0), ("b", 8, 32)], 96)).unwrap_err();
        assert!(
            matches!(&e, GgufError::TensorOverlap { name, offset, len, next, next_offset }
                if name == "a" && next == "b" && *len == 64 && *next_offset == offset + 32),
            "{e}"
        );
        // Same start.
        let e = parse_header(&with_tensors(&[("a", 8, 32), ("b", 8, 32)], 96)).unwrap_err();
        assert!(matches!(e, GgufError::TensorOverlap { .. }), "{e}");
        // `b` lies before `a`.
        let e = parse_header(&with_tensors(&[("a", 8, 64), ("b", 8, 0)], 96)).unwrap_err();
        assert!(
            matches!(&e, GgufError::TensorOutOfOrder { name, previous, .. }
                if name == "b" && previous == "a"),
            "{e}"
        );
        // An overlap is reported even when the tensor also runs past the end.
        let e = parse_header(&with_tensors(&[("a", 64, 0), ("b", 8, 32)], 64)).unwrap_err();
        assert!(matches!(e, GgufError::TensorOverlap { .. }), "{e}");
        let e = parse_header(&with_tensors(&[("a", 8, 0), ("b", 64, 32)], 64)).unwrap_err();
        assert!(matches!(e, GgufError::TensorOutOfBounds { .. }), "{e}");
    }

    #[test]
    fn alignment_must_be_power_of_two() {
        let mut m = Metadata::new();
        assert_eq!(alignment_of(&m).unwrap(), 32);
        m.set(KEY_ALIGNMENT, MetaValue::U32(64));
        assert_eq!(alignment_of(&m).unwrap(), 64);
        for bad in [0u32, 48] {
            m.set(KEY_ALIGNMENT, MetaValue::U32(bad));
            let e = alignment_of(&m).unwrap_err();
            assert!(matches!(e, GgufError::BadAlignment { .. }), "{e}");
            assert!(e.to_string().contains("power of two"));
        }
        m.set(KEY_ALIGNMENT, MetaValue::String("32".into()));
        assert!(matches!(alignment_of(&m), Err(GgufError::WrongType { .. })));
    }
}
