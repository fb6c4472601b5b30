//! A restricted unpickler: what `torch.load(weights_only=True)` accepts
//! for a state dict, and nothing else.
//!
//! It reads pickle protocols 2 to 5, builds plain values (None, bools,
//! ints, floats, strings, bytes, tuples, lists, dicts) and knows a short
//! list of globals: `collections.OrderedDict`, PyTorch's tensor and
//! parameter rebuild functions, its storage classes and dtypes. Any other
//! global (`os.system`, `builtins.eval`, a model's class) is an error that
//! names it; nothing in a pickle is ever called, a known global is only
//! recognised. The stack, the memo and nesting are bounded, and a
//! container stops being writable once it is put inside another, so no
//! pickle can make a cycle or a structure deeper than [`MAX_DEPTH`].

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

/// The deepest nesting of containers accepted (a state dict needs 3).
pub(super) const MAX_DEPTH: usize = 64;
/// The most values on the stack, and the most memo entries.
const MAX_ITEMS: usize = 1 << 20;
/// The most dimensions of a tensor.
const MAX_DIMS: usize = 64;

/// An element type of a PyTorch storage or tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    F32,
    F64,
    F16,
    BF16,
    U8,
    I8,
    I16,
    I32,
    I64,
    U16,
    U32,
    Bool,
    /// A dtype leangrad cannot hold losslessly, by PyTorch's name.
    Other(&'static str),
}

impl Kind {
    /// Bytes per element, for the kinds leangrad reads.
    pub(super) fn size(self) -> Option<usize> {
        Some(match self {
            Kind::U8 | Kind::I8 | Kind::Bool => 1,
            Kind::F16 | Kind::BF16 | Kind::I16 | Kind::U16 => 2,
            Kind::F32 | Kind::I32 | Kind::U32 => 4,
            Kind::F64 | Kind::I64 => 8,
            Kind::Other(_) => return None,
        })
    }

    /// PyTorch's name, for messages.
    pub(super) fn torch_name(self) -> &'static str {
        match self {
            Kind::F32 => "torch.float32",
            Kind::F64 => "torch.float64",
            Kind::F16 => "torch.float16",
            Kind::BF16 => "torch.bfloat16",
            Kind::U8 => "torch.uint8",
            Kind::I8 => "torch.int8",
            Kind::I16 => "torch.int16",
            Kind::I32 => "torch.int32",
            Kind::I64 => "torch.int64",
            Kind::U16 => "torch.uint16",
            Kind::U32 => "torch.uint32",
            Kind::Bool => "torch.bool",
            Kind::Other(name) => name,
        }
    }
}

/// The storage classes (`torch.FloatStorage`, …) by name.
const STORAGES: &[(&str, Kind)] = &[
    ("FloatStorage", Kind::F32),
    ("DoubleStorage", Kind::F64),
    ("HalfStorage", Kind::F16),
    ("BFloat16Storage", Kind::BF16),
    ("ByteStorage", Kind::U8),
    ("CharStorage", Kind::I8),
    ("ShortStorage", Kind::I16),
    ("IntStorage", Kind::I32),
    ("LongStorage", Kind::I64),
    ("BoolStorage", Kind::Bool),
    ("UntypedStorage", Kind::U8),
    ("ComplexFloatStorage", Kind::Other("torch.complex64")),
    ("ComplexDoubleStorage", Kind::Other("torch.complex128")),
    ("QInt8Storage", Kind::Other("torch.qint8")),
    ("QUInt8Storage", Kind::Other("torch.quint8")),
    ("QInt32Storage", Kind::Other("torch.qint32")),
];

/// The dtypes (`torch.float32`, …) by name, as `_rebuild_tensor_v3` names them.
const DTYPES: &[(&str, Kind)] = &[
    ("float32", Kind::F32),
    ("float64", Kind::F64),
    ("float16", Kind::F16),
    ("bfloat16", Kind::BF16),
    ("uint8", Kind::U8),
    ("int8", Kind::I8),
    ("int16", Kind::I16),
    ("int32", Kind::I32),
    ("int64", Kind::I64),
    ("uint16", Kind::U16),
    ("uint32", Kind::U32),
    ("bool", Kind::Bool),
    ("uint64", Kind::Other("torch.uint64")),
    ("complex32", Kind::Other("torch.complex32")),
    ("complex64", Kind::Other("torch.complex64")),
    ("complex128", Kind::Other("torch.complex128")),
    ("float8_e4m3fn", Kind::Other("torch.float8_e4m3fn")),
    ("float8_e5m2", Kind::Other("torch.float8_e5m2")),
    ("float8_e4m3fnuz", Kind::Other("torch.float8_e4m3fnuz")),
    ("float8_e5m2fnuz", Kind::Other("torch.float8_e5m2fnuz")),
];

/// A global the unpickler recognises. Nothing is ever called: each is
/// interpreted by what the unpickler itself builds from its arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Global {
    OrderedDict,
    RebuildTensor,
    RebuildTensorV2,
    RebuildTensorV3,
    RebuildParameter,
    RebuildParameterWithState,
    Storage(Kind),
    Dtype(Kind),
}

impl Global {
    /// The allowed global `module.name`, or `None`.
    fn find(module: &str, name: &str) -> Option<Global> {
        let lookup =
            |table: &[(&str, Kind)]| table.iter().find(|(n, _)| *n == name).map(|&(_, k)| k);
        Some(match (module, name) {
            ("collections", "OrderedDict") => Global::OrderedDict,
            ("torch._utils", "_rebuild_tensor") => Global::RebuildTensor,
            ("torch._utils", "_rebuild_tensor_v2") => Global::RebuildTensorV2,
            ("torch._utils", "_rebuild_tensor_v3") => Global::RebuildTensorV3,
            ("torch._utils", "_rebuild_parameter") => Global::RebuildParameter,
            ("torch._utils", "_rebuild_parameter_with_state") => Global::RebuildParameterWithState,
            ("torch.storage", "UntypedStorage") => Global::Storage(Kind::U8),
            ("torch", _) => match (lookup(STORAGES), lookup(DTYPES)) {
                (Some(k), _) => Global::Storage(k),
                (None, Some(k)) => Global::Dtype(k),
                (None, None) => return None,
            },
            _ => return None,
        })
    }
}

/// A storage as a persistent id names it: the archive entry
/// `data/<key>`, holding `numel` elements of `kind`.
#[derive(Debug)]
pub(super) struct StorageRef {
    pub(super) key: String,
    pub(super) kind: Kind,
    pub(super) numel: u64,
}

/// A tensor as the rebuild functions describe it: a view of `kind`
/// elements into a storage (offset, size and stride in elements of
/// `kind`), checked later against the storage (where its name is known).
#[derive(Debug)]
pub(super) struct TensorRef {
    pub(super) storage: Rc<StorageRef>,
    pub(super) kind: Kind,
    pub(super) offset: i64,
    pub(super) size: Vec<i64>,
    pub(super) stride: Vec<i64>,
}

/// A list or dict: writable until it is put inside another value.
#[derive(Debug)]
pub(super) struct Container<T> {
    pub(super) items: RefCell<T>,
    frozen: Cell<bool>,
    depth: Cell<usize>,
}

impl<T> Container<T> {
    fn new(items: T) -> Rc<Container<T>> {
        Rc::new(Container {
            items: RefCell::new(items),
            frozen: Cell::new(false),
            depth: Cell::new(1),
        })
    }
}

/// A dict's entries in insertion order (duplicates resolved by the reader).
pub(super) type Entries = Vec<(Value, Value)>;

/// A value the unpickler builds.
#[derive(Debug, Clone)]
pub(super) enum Value {
    None,
    Bool(bool),
    Int(i64),
    /// A float (its value is never needed: only tensors are returned).
    Float,
    Str(Rc<str>),
    /// Bytes (as floats, never needed).
    Bytes,
    /// The items and the nesting depth.
    Tuple(Rc<(Vec<Value>, usize)>),
    List(Rc<Container<Vec<Value>>>),
    Dict(Rc<Container<Entries>>),
    Global(Global),
    Storage(Rc<StorageRef>),
    Tensor(Rc<TensorRef>),
}

impl Value {
    /// A short name of the value's type, for messages.
    pub(super) fn type_name(&self) -> &'static str {
        match self {
            Value::None => "None",
            Value::Bool(_) => "a bool",
            Value::Int(_) => "an int",
            Value::Float => "a float",
            Value::Str(_) => "a string",
            Value::Bytes => "bytes",
            Value::Tuple(_) => "a tuple",
            Value::List(_) => "a list",
            Value::Dict(_) => "a dict",
            Value::Global(_) => "a class or function",
            Value::Storage(_) => "a storage",
            Value::Tensor(_) => "a tensor",
        }
    }

    fn depth(&self) -> usize {
        match self {
            Value::Tuple(t) => t.1,
            Value::List(c) => c.depth.get(),
            Value::Dict(c) => c.depth.get(),
            _ => 0,
        }
    }

    /// Makes the value (a list or dict) read-only: it is now inside another.
    fn freeze(&self) {
        match self {
            Value::List(c) => c.frozen.set(true),
            Value::Dict(c) => c.frozen.set(true),
            _ => {}
        }
    }
}

/// The unpickler's state.
struct Machine<'p> {
    data: &'p [u8],
    pos: usize,
    stack: Vec<Value>,
    marks: Vec<usize>,
    memo: HashMap<u32, Value>,
}

/// The object a pickle describes, or why it is refused (the message says
/// where in the pickle).
pub(super) fn unpickle(data: &[u8]) -> Result<Value, String> {
    let mut m = Machine {
        data,
        pos: 0,
        stack: Vec::new(),
        marks: Vec::new(),
        memo: HashMap::new(),
    };
    loop {
        let at = m.pos;
        let op = m.take(1).map_err(|e| format!("byte {at}: {e}"))?[0];
        match m.step(op) {
            Ok(true) => continue,
            Ok(false) => return m.pop().map_err(|e| format!("byte {at}: {e}")),
            Err(e) => return Err(format!("byte {at} (opcode 0x{op:02x}): {e}")),
        }
    }
}

fn int(v: &Value, what: &str) -> Result<i64, String> {
    match v {
        Value::Int(i) => Ok(*i),
        Value::Bool(b) => Ok(i64::from(*b)),
        other => Err(format!("{what} is {}, not an int", other.type_name())),
    }
}

fn ints(v: &Value, what: &str) -> Result<Vec<i64>, String> {
    match v {
        Value::Tuple(t) if t.0.len() <= MAX_DIMS => t.0.iter().map(|d| int(d, what)).collect(),
        Value::Tuple(t) => Err(format!(
            "{what} has {} dimensions (at most {MAX_DIMS})",
            t.0.len()
        )),
        other => Err(format!("{what} is {}, not a tuple", other.type_name())),
    }
}

impl<'p> Machine<'p> {
    fn take(&mut self, n: usize) -> Result<&'p [u8], String> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.data.len());
        let end = end.ok_or_else(|| {
            format!(
                "needs {n} bytes but {} remain (truncated)",
                self.data.len() - self.pos
            )
        })?;
        let s = &self.data[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn take_array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let s = self.take(N)?;
        s.try_into().map_err(|_| "short read".to_string())
    }

    /// A length of `N` little-endian bytes, checked against what remains.
    fn take_len<const N: usize>(&mut self) -> Result<usize, String> {
        let mut b = [0u8; 8];
        b[..N].copy_from_slice(&self.take_array::<N>()?);
        let n = u64::from_le_bytes(b);
        usize::try_from(n)
            .ok()
            .filter(|&n| n <= self.data.len() - self.pos)
            .ok_or_else(|| {
                format!(
                    "declares {n} bytes but {} remain",
                    self.data.len() - self.pos
                )
            })
    }

    /// A newline-terminated line (of GLOBAL), as UTF-8.
    fn line(&mut self) -> Result<&'p str, String> {
        let rest = &self.data[self.pos..];
        let n = rest
            .iter()
            .take(256)
            .position(|&b| b == b'\n')
            .ok_or("a global's name is not ended within 256 bytes")?;
        let s = std::str::from_utf8(&rest[..n]).map_err(|_| "a global's name is not UTF-8")?;
        self.pos += n + 1;
        Ok(s)
    }

    fn push(&mut self, v: Value) -> Result<(), String> {
        if self.stack.len() >= MAX_ITEMS {
            return Err(format!("more than {MAX_ITEMS} values on the stack"));
        }
        self.stack.push(v);
        Ok(())
    }

    /// The top of the stack, never below the innermost mark.
    fn pop(&mut self) -> Result<Value, String> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return Err("pops an empty stack".into());
        }
        self.stack.pop().ok_or_else(|| "pops an empty stack".into())
    }

    fn top(&self) -> Result<&Value, String> {
        let floor = self.marks.last().copied().unwrap_or(0);
        self.stack
            .get(floor..)
            .and_then(<[Value]>::last)
            .ok_or_else(|| "reads an empty stack".into())
    }

    /// The values pushed since the innermost mark (which is removed).
    fn pop_mark(&mut self) -> Result<Vec<Value>, String> {
        let m = self.marks.pop().ok_or("no mark to pop to")?;
        Ok(self.stack.split_off(m))
    }

    fn memo_put(&mut self, key: u32) -> Result<(), String> {
        let v = self.top()?.clone();
        if self.memo.len() >= MAX_ITEMS && !self.memo.contains_key(&key) {
            return Err(format!("more than {MAX_ITEMS} memo entries"));
        }
        self.memo.insert(key, v);
        Ok(())
    }

    fn memo_get(&mut self, key: u32) -> Result<(), String> {
        let v = self
            .memo
            .get(&key)
            .cloned()
            .ok_or(format!("memo entry {key} is not set"))?;
        self.push(v)
    }

    /// A tuple of `items`, which are frozen inside it.
    fn tuple(items: Vec<Value>) -> Result<Value, String> {
        let depth = items.iter().map(Value::depth).max().unwrap_or(0) + 1;
        if depth > MAX_DEPTH {
            return Err(format!("nests values deeper than {MAX_DEPTH} levels"));
        }
        items.iter().for_each(Value::freeze);
        Ok(Value::Tuple(Rc::new((items, depth))))
    }

    /// Puts `children` into the container `target` (a list or dict): the
    /// container must still be writable, and the children become read-only.
    fn adopt<T>(target: &Container<T>, children: &[&Value]) -> Result<(), String> {
        for c in children {
            c.freeze();
        }
        if target.frozen.get() {
            return Err("changes a container after putting it inside another (recursive objects are not read)".into());
        }
        let deepest = children.iter().map(|c| c.depth()).max().unwrap_or(0);
        if deepest + 1 > MAX_DEPTH {
            return Err(format!("nests values deeper than {MAX_DEPTH} levels"));
        }
        target.depth.set(target.depth.get().max(deepest + 1));
        Ok(())
    }

    fn append(&mut self, list: &Value, items: Vec<Value>) -> Result<(), String> {
        let Value::List(l) = list else {
            return Err(format!("appends to {}, not a list", list.type_name()));
        };
        Self::adopt(l, &items.iter().collect::<Vec<_>>())?;
        l.items.borrow_mut().extend(items);
        Ok(())
    }

    fn set_items(&mut self, dict: &Value, items: Vec<Value>) -> Result<(), String> {
        let Value::Dict(d) = dict else {
            return Err(format!("sets items of {}, not a dict", dict.type_name()));
        };
        if !items.len().is_multiple_of(2) {
            return Err("sets an odd number of keys and values".into());
        }
        Self::adopt(d, &items.iter().collect::<Vec<_>>())?;
        let mut it = items.into_iter();
        let mut entries = d.items.borrow_mut();
        while let (Some(k), Some(v)) = (it.next(), it.next()) {
            entries.push((k, v));
        }
        Ok(())
    }

    /// One opcode; `Ok(false)` at STOP.
    fn step(&mut self, op: u8) -> Result<bool, String> {
        match op {
            0x80 => {
                let p = self.take(1)?[0];
                if !(2..=5).contains(&p) {
                    return Err(format!("pickle protocol {p} (2 to 5 are read)"));
                }
            }
            0x95 => {
                self.take_len::<8>()?; // FRAME: only a hint for buffering
            }
            b'.' => return Ok(false),
            b'(' => {
                if self.marks.len() >= MAX_ITEMS {
                    return Err(format!("more than {MAX_ITEMS} marks"));
                }
                self.marks.push(self.stack.len());
            }
            b'0' => {
                self.pop()?;
            }
            b'1' => {
                self.pop_mark()?;
            }
            b'2' => {
                let v = self.top()?.clone();
                self.push(v)?;
            }
            _ => return self.step_value(op),
        }
        Ok(true)
    }

    /// Opcodes that push a scalar, string or container.
    fn step_value(&mut self, op: u8) -> Result<bool, String> {
        let v = match op {
            b'N' => Value::None,
            0x88 => Value::Bool(true),
            0x89 => Value::Bool(false),
            b'J' => Value::Int(i32::from_le_bytes(self.take_array()?).into()),
            b'K' => Value::Int(self.take(1)?[0].into()),
            b'M' => Value::Int(u16::from_le_bytes(self.take_array()?).into()),
            0x8a => {
                let n = self.take(1)?[0] as usize;
                Value::Int(long(self.take(n)?)?)
            }
            0x8b => {
                let n = self.take_len::<4>()?;
                Value::Int(long(self.take(n)?)?)
            }
            b'G' => {
                self.take(8)?;
                Value::Float
            }
            0x8c | b'X' | 0x8d => {
                let n = match op {
                    0x8c => self.take_len::<1>()?,
                    b'X' => self.take_len::<4>()?,
                    _ => self.take_len::<8>()?,
                };
                let s = std::str::from_utf8(self.take(n)?).map_err(|_| "a string is not UTF-8")?;
                Value::Str(s.into())
            }
            b'C' | b'B' | 0x8e | 0x96 => {
                let n = match op {
                    b'C' => self.take_len::<1>()?,
                    b'B' => self.take_len::<4>()?,
                    _ => self.take_len::<8>()?,
                };
                self.take(n)?;
                Value::Bytes
            }
            b')' => Self::tuple(Vec::new())?,
            0x85..=0x87 => {
                let n = usize::from(op - 0x84);
                let floor = self.marks.last().copied().unwrap_or(0);
                if self.stack.len() < floor + n {
                    return Err(format!("makes a {n}-tuple of fewer values"));
                }
                let items = self.stack.split_off(self.stack.len() - n);
                Self::tuple(items)?
            }
            b't' => {
                let items = self.pop_mark()?;
                Self::tuple(items)?
            }
            b']' => Value::List(Container::new(Vec::new())),
            b'}' => Value::Dict(Container::new(Vec::new())),
            b'l' => {
                let items = self.pop_mark()?;
                let list = Value::List(Container::new(Vec::new()));
                self.append(&list, items)?;
                list
            }
            b'd' => {
                let items = self.pop_mark()?;
                let dict = Value::Dict(Container::new(Vec::new()));
                self.set_items(&dict, items)?;
                dict
            }
            _ => return self.step_mutate(op),
        };
        self.push(v)?;
        Ok(true)
    }

    /// Opcodes that change a container, use the memo, name a global or
    /// build an object.
    fn step_mutate(&mut self, op: u8) -> Result<bool, String> {
        match op {
            b'a' => {
                let item = self.pop()?;
                let list = self.top()?.clone();
                self.append(&list, vec![item])?;
            }
            b'e' => {
                let items = self.pop_mark()?;
                let list = self.top()?.clone();
                self.append(&list, items)?;
            }
            b's' => {
                let v = self.pop()?;
                let k = self.pop()?;
                let dict = self.top()?.clone();
                self.set_items(&dict, vec![k, v])?;
            }
            b'u' => {
                let items = self.pop_mark()?;
                let dict = self.top()?.clone();
                self.set_items(&dict, items)?;
            }
            b'q' => {
                let k = self.take(1)?[0];
                self.memo_put(k.into())?;
            }
            b'r' => {
                let k = u32::from_le_bytes(self.take_array()?);
                self.memo_put(k)?;
            }
            0x94 => {
                let k = u32::try_from(self.memo.len()).map_err(|_| "memo is full")?;
                self.memo_put(k)?;
            }
            b'h' => {
                let k = self.take(1)?[0];
                self.memo_get(k.into())?;
            }
            b'j' => {
                let k = u32::from_le_bytes(self.take_array()?);
                self.memo_get(k)?;
            }
            b'c' => {
                let module = self.line()?;
                let name = self.line()?;
                self.push(global(module, name)?)?;
            }
            0x93 => {
                let name = self.pop()?;
                let module = self.pop()?;
                match (&module, &name) {
                    (Value::Str(m), Value::Str(n)) => {
                        let g = global(m, n)?;
                        self.push(g)?;
                    }
                    _ => return Err("STACK_GLOBAL of values that are not strings".into()),
                }
            }
            _ => return self.step_object(op),
        }
        Ok(true)
    }

    /// Opcodes that make objects: persistent ids, REDUCE, NEWOBJ, BUILD.
    fn step_object(&mut self, op: u8) -> Result<bool, String> {
        match op {
            b'Q' => {
                let pid = self.pop()?;
                let v = persistent(&pid)?;
                self.push(v)?;
            }
            b'R' | 0x81 => {
                let args = self.pop()?;
                let callable = self.pop()?;
                let Value::Tuple(args) = &args else {
                    return Err(format!(
                        "calls with {}, not a tuple of arguments",
                        args.type_name()
                    ));
                };
                let v = call(&callable, &args.0)?;
                self.push(v)?;
            }
            b'b' => {
                let _state = self.pop()?;
                match self.top()? {
                    // torch.save's OrderedDict carries `_metadata` (layer
                    // versions) as its state: not needed for the tensors.
                    Value::Dict(_) => {}
                    other => {
                        return Err(format!(
                            "sets the state of {}, which a state dict never does",
                            other.type_name()
                        ))
                    }
                }
            }
            _ => {
                return Err(format!(
                    "opcode 0x{op:02x} ({}) is not read (a state dict does not need it)",
                    opcode_name(op)
                ))
            }
        }
        Ok(true)
    }
}

/// A little-endian two's-complement integer of LONG1/LONG4 that fits i64.
fn long(bytes: &[u8]) -> Result<i64, String> {
    if bytes.is_empty() {
        return Ok(0);
    }
    let negative = bytes[bytes.len() - 1] & 0x80 != 0;
    let fill = if negative { 0xff } else { 0 };
    if bytes.len() > 8 && bytes[8..].iter().any(|&b| b != fill) {
        return Err(format!(
            "an integer of {} bytes does not fit 64 bits",
            bytes.len()
        ));
    }
    let mut b = [fill; 8];
    let n = bytes.len().min(8);
    b[..n].copy_from_slice(&bytes[..n]);
    let v = i64::from_le_bytes(b);
    if (v < 0) != negative {
        return Err("an integer does not fit 64 bits".into());
    }
    Ok(v)
}

/// The allowed global `module.name`, or the refusal that names it.
fn global(module: &str, name: &str) -> Result<Value, String> {
    Global::find(module, name)
        .map(Value::Global)
        .ok_or_else(|| {
            format!(
                "refuses the global `{module}.{name}`: only a state dict's tensors are read \
             (nothing in the file was run; a pickled model or arbitrary object cannot be \
             loaded, save `model.state_dict()` instead)"
            )
        })
}

/// A storage from its persistent id `('storage', type, key, location, numel)`.
fn persistent(pid: &Value) -> Result<Value, String> {
    let Value::Tuple(t) = pid else {
        return Err(format!("persistent id is {}, not a tuple", pid.type_name()));
    };
    match t.0.as_slice() {
        [Value::Str(tag), Value::Global(Global::Storage(kind)), Value::Str(key), _, numel]
            if &**tag == "storage" =>
        {
            let numel = u64::try_from(int(numel, "a storage's size")?)
                .map_err(|_| "a storage's size is negative")?;
            Ok(Value::Storage(Rc::new(StorageRef {
                key: key.to_string(),
                kind: *kind,
                numel,
            })))
        }
        _ => Err("persistent id is not ('storage', storage type, key, location, size)".into()),
    }
}

/// What calling an allowed global builds (nothing is run).
fn call(callable: &Value, args: &[Value]) -> Result<Value, String> {
    let Value::Global(g) = callable else {
        return Err(format!("calls {}", callable.type_name()));
    };
    match (g, args) {
        (Global::OrderedDict, []) => Ok(Value::Dict(Container::new(Vec::new()))),
        (Global::RebuildTensor, [s, o, size, stride])
        | (Global::RebuildTensorV2, [s, o, size, stride, _, _])
        | (Global::RebuildTensorV2, [s, o, size, stride, _, _, _]) => {
            tensor(s, o, size, stride, None)
        }
        (Global::RebuildTensorV3, [s, o, size, stride, _, _, dtype])
        | (Global::RebuildTensorV3, [s, o, size, stride, _, _, dtype, _]) => match dtype {
            Value::Global(Global::Dtype(k)) => tensor(s, o, size, stride, Some(*k)),
            other => Err(format!(
                "_rebuild_tensor_v3's dtype is {}",
                other.type_name()
            )),
        },
        (Global::RebuildParameter, [t @ Value::Tensor(_), _, _])
        | (Global::RebuildParameterWithState, [t @ Value::Tensor(_), _, _, _]) => Ok(t.clone()),
        (g, args) => Err(format!(
            "calls {g:?} with {} arguments it does not take",
            args.len()
        )),
    }
}

/// A tensor view of storage `s`; `kind` is its dtype when the storage is
/// untyped (`_rebuild_tensor_v3`), else the storage's.
fn tensor(
    s: &Value,
    o: &Value,
    size: &Value,
    stride: &Value,
    kind: Option<Kind>,
) -> Result<Value, String> {
    let Value::Storage(storage) = s else {
        return Err(format!(
            "rebuilds a tensor from {}, not a storage",
            s.type_name()
        ));
    };
    let size = ints(size, "a tensor's size")?;
    let stride = ints(stride, "a tensor's stride")?;
    if size.len() != stride.len() {
        return Err(format!(
            "a tensor's size {size:?} and stride {stride:?} differ in length"
        ));
    }
    Ok(Value::Tensor(Rc::new(TensorRef {
        storage: storage.clone(),
        kind: kind.unwrap_or(storage.kind),
        offset: int(o, "a tensor's storage offset")?,
        size,
        stride,
    })))
}

/// The pickletools name of an opcode the unpickler does not read.
fn opcode_name(op: u8) -> &'static str {
    match op {
        b'I' | b'L' | b'F' | b'S' | b'V' | b'P' | b'g' | b'p' | b'i' | b'o' => "protocol 0/1 text",
        b'T' | b'U' => "Python 2 string",
        0x82..=0x84 => "EXT (copyreg extension)",
        0x8f..=0x91 => "set",
        0x92 => "NEWOBJ_EX",
        0x97 | 0x98 => "out-of-band buffer",
        _ => "unknown",
    }
}
