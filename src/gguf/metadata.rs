//! GGUF metadata values and typed look-ups. Keys are kept in file order.

use super::GgufError;

/// GGUF value type ids (`gguf_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum MetaType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl MetaType {
    /// The type with GGUF id `v`, or `None` outside 0..=12.
    pub fn from_u32(v: u32) -> Option<Self> {
        use MetaType::*;
        Some(match v {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }
}

/// One metadata value. Arrays remember their element type so that empty
/// arrays and arrays of arrays round-trip through the writer.
#[derive(Clone, Debug, PartialEq)]
pub enum MetaValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(MetaType, Vec<MetaValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl MetaValue {
    /// The GGUF type of this value.
    pub fn meta_type(&self) -> MetaType {
        match self {
            MetaValue::U8(_) => MetaType::U8,
            MetaValue::I8(_) => MetaType::I8,
            MetaValue::U16(_) => MetaType::U16,
            MetaValue::I16(_) => MetaType::I16,
            MetaValue::U32(_) => MetaType::U32,
            MetaValue::I32(_) => MetaType::I32,
            MetaValue::F32(_) => MetaType::F32,
            MetaValue::Bool(_) => MetaType::Bool,
            MetaValue::String(_) => MetaType::String,
            MetaValue::Array(..) => MetaType::Array,
            MetaValue::U64(_) => MetaType::U64,
            MetaValue::I64(_) => MetaType::I64,
            MetaValue::F64(_) => MetaType::F64,
        }
    }

    /// The value as a signed 128-bit integer when it is any integer type.
    pub fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            MetaValue::U8(v) => v as i128,
            MetaValue::I8(v) => v as i128,
            MetaValue::U16(v) => v as i128,
            MetaValue::I16(v) => v as i128,
            MetaValue::U32(v) => v as i128,
            MetaValue::I32(v) => v as i128,
            MetaValue::U64(v) => v as i128,
            MetaValue::I64(v) => v as i128,
            _ => return None,
        })
    }

    /// The value as f64 when it is a float or an integer.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            MetaValue::F32(v) => Some(v as f64),
            MetaValue::F64(v) => Some(v),
            _ => self.as_i128().map(|v| v as f64),
        }
    }

    /// The value as a string slice when it is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(s) => Some(s),
            _ => None,
        }
    }
}

/// Ordered key/value metadata of one GGUF file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metadata {
    entries: Vec<(String, MetaValue)>,
}

impl Metadata {
    /// Empty metadata.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `key`, replacing an earlier value in place.
    pub fn set(&mut self, key: impl Into<String>, value: MetaValue) {
        let key = key.into();
        match self.entries.iter_mut().find(|(k, _)| *k == key) {
            Some(e) => e.1 = value,
            None => self.entries.push((key, value)),
        }
    }

    /// Appends `key` without looking for an earlier entry (O(1)); the caller
    /// has checked that the key is new.
    pub(crate) fn push_new(&mut self, key: String, value: MetaValue) {
        self.entries.push((key, value));
    }

    /// Removes `key`, returning its value.
    pub fn remove(&mut self, key: &str) -> Option<MetaValue> {
        let i = self.entries.iter().position(|(k, _)| k == key)?;
        Some(self.entries.remove(i).1)
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.entries.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// Whether `key` is present.
    pub fn contains(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// Every key and value, in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &MetaValue)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no keys.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn required(&self, key: &str) -> Result<&MetaValue, GgufError> {
        self.get(key).ok_or_else(|| GgufError::MissingKey {
            key: key.to_string(),
        })
    }

    fn wrong(key: &str, expected: &'static str, v: &MetaValue) -> GgufError {
        GgufError::WrongType {
            key: key.to_string(),
            expected,
            found: format!("{:?}", v.meta_type()),
        }
    }

    /// Any integer value that fits in u64.
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        let v = self.required(key)?;
        v.as_i128()
            .and_then(|x| u64::try_from(x).ok())
            .ok_or_else(|| Self::wrong(key, "unsigned integer", v))
    }

    /// Any integer value that fits in u32.
    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        let v = self.required(key)?;
        v.as_i128()
            .and_then(|x| u32::try_from(x).ok())
            .ok_or_else(|| Self::wrong(key, "u32", v))
    }

    /// Any integer value that fits in i64.
    pub fn get_i64(&self, key: &str) -> Result<i64, GgufError> {
        let v = self.required(key)?;
        v.as_i128()
            .and_then(|x| i64::try_from(x).ok())
            .ok_or_else(|| Self::wrong(key, "integer", v))
    }

    /// A float (or integer) value as f32.
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        let v = self.required(key)?;
        v.as_f64()
            .map(|x| x as f32)
            .ok_or_else(|| Self::wrong(key, "f32", v))
    }

    /// A bool value.
    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        match self.required(key)? {
            MetaValue::Bool(b) => Ok(*b),
            v => Err(Self::wrong(key, "bool", v)),
        }
    }

    /// A string value.
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        let v = self.required(key)?;
        v.as_str().ok_or_else(|| Self::wrong(key, "string", v))
    }

    /// The elements of an array value.
    pub fn get_array(&self, key: &str) -> Result<&[MetaValue], GgufError> {
        match self.required(key)? {
            MetaValue::Array(_, items) => Ok(items),
            v => Err(Self::wrong(key, "array", v)),
        }
    }

    /// An array of strings (e.g. `tokenizer.ggml.tokens`).
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>, GgufError> {
        self.get_array(key)?
            .iter()
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| Self::wrong(key, "array of string", v))
            })
            .collect()
    }

    /// An array of floats or integers, as f32 (e.g. `tokenizer.ggml.scores`).
    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>, GgufError> {
        self.get_array(key)?
            .iter()
            .map(|v| {
                v.as_f64()
                    .map(|x| x as f32)
                    .ok_or_else(|| Self::wrong(key, "array of f32", v))
            })
            .collect()
    }

    /// An array of integers, as i64.
    pub fn get_i64_array(&self, key: &str) -> Result<Vec<i64>, GgufError> {
        self.get_array(key)?
            .iter()
            .map(|v| {
                v.as_i128()
                    .and_then(|x| i64::try_from(x).ok())
                    .ok_or_else(|| Self::wrong(key, "array of integer", v))
            })
            .collect()
    }

    /// `Ok(None)` when absent, an error when present with the wrong type.
    /// `get` is one of the typed getters; its result may borrow from `self`
    /// (`md.opt("tokenizer.ggml.tokens", Metadata::get_str_array)`).
    pub fn opt<'a, T>(
        &'a self,
        key: &str,
        get: impl FnOnce(&'a Self, &str) -> Result<T, GgufError>,
    ) -> Result<Option<T>, GgufError> {
        if self.contains(key) {
            get(self, key).map(Some)
        } else {
            Ok(None)
        }
    }

    /// The architecture name (`general.architecture`).
    pub fn architecture(&self) -> Result<&str, GgufError> {
        self.get_str("general.architecture")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opt_accepts_borrowing_getters() {
        let mut m = Metadata::new();
        m.set("s", MetaValue::String("x".into()));
        m.set(
            "a",
            MetaValue::Array(MetaType::String, vec![MetaValue::String("y".into())]),
        );
        assert_eq!(m.opt("s", Metadata::get_str).unwrap(), Some("x"));
        assert_eq!(
            m.opt("a", Metadata::get_str_array).unwrap(),
            Some(vec!["y"])
        );
        assert_eq!(m.opt("z", Metadata::get_str).unwrap(), None);
        assert!(m.opt("s", Metadata::get_u32).is_err());
    }
}
