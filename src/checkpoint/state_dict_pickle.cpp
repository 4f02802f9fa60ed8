#include "checkpoint/state_dict_pickle.h"

#include <cstring>
#include <map>
#include <memory>
#include <set>

#include "deepspeed/errors.h"

namespace deepspeed {
namespace checkpoint {
namespace {

// What a state dict's pickle builds. Shared, so a memoized dict filled after it was memoized is
// the same object wherever it is fetched again.
struct Value;
using ValuePtr = std::shared_ptr<Value>;
struct Value {
  enum Kind {
    kNone, kBool, kInt, kFloat, kString, kTuple, kList, kDict, kGlobal, kStorage, kTensor
  };
  Kind kind = kNone;
  int64_t integer = 0;
  std::string text;  // a string, or a global's "module.name", or a storage's key
  std::vector<ValuePtr> items;                          // tuple, list
  std::vector<std::pair<ValuePtr, ValuePtr>> entries;  // dict, in insertion order
  at::ScalarType dtype = at::kFloat;                   // a storage class or a storage
  PickledTensor tensor;
};

ValuePtr make(Value::Kind kind) {
  auto v = std::make_shared<Value>();
  v->kind = kind;
  return v;
}

// torch.<name>: the storage classes torch.save names.
struct StorageClass {
  at::ScalarType type;
  const char* name;
};
constexpr StorageClass kStorageClasses[] = {
    {at::kFloat, "FloatStorage"}, {at::kBFloat16, "BFloat16Storage"},
    {at::kHalf, "HalfStorage"},   {at::kDouble, "DoubleStorage"},
    {at::kLong, "LongStorage"},   {at::kInt, "IntStorage"},
    {at::kShort, "ShortStorage"}, {at::kChar, "CharStorage"},
    {at::kByte, "ByteStorage"},   {at::kBool, "BoolStorage"}};

const std::set<std::string>& callables() {
  static const std::set<std::string> s = {"collections.OrderedDict",
                                          "torch._utils._rebuild_tensor_v2",
                                          "torch._utils._rebuild_parameter"};
  return s;
}

class Unpickler {
 public:
  Unpickler(const std::string& bytes, const std::string& path) : b_(bytes), path_(path) {}

  ValuePtr run() {
    while (true) {
      const size_t at = pos_;
      const unsigned char op = byte();
      switch (op) {
        case 0x80: byte(); break;       // PROTO
        case 0x95: take(8); break;      // FRAME: its length; frames are read as they come
        case '.': return pop();         // STOP
        case '(': marks_.push_back(stack_.size()); break;
        case ')': push(make(Value::kTuple)); break;
        case 't': push(tuple_of(pop_mark())); break;
        case 0x85: push(tuple_of(pop_n(1))); break;
        case 0x86: push(tuple_of(pop_n(2))); break;
        case 0x87: push(tuple_of(pop_n(3))); break;
        case ']': push(make(Value::kList)); break;
        case 'a': { auto v = pop(); list_top()->items.push_back(v); break; }
        case 'e': {
          auto vs = pop_mark();
          auto l = list_top();
          for (auto& v : vs) l->items.push_back(v);
          break;
        }
        case '}': push(make(Value::kDict)); break;
        case 's': { auto v = pop(), k = pop(); dict_top()->entries.emplace_back(k, v); break; }
        case 'u': {
          auto kv = pop_mark();
          if (kv.size() % 2) bad("SETITEMS with an odd number of items", at);
          auto d = dict_top();
          for (size_t i = 0; i < kv.size(); i += 2) d->entries.emplace_back(kv[i], kv[i + 1]);
          break;
        }
        case 'N': push(make(Value::kNone)); break;
        case 0x88: case 0x89: {
          auto v = make(Value::kBool);
          v->integer = op == 0x88;
          push(v);
          break;
        }
        case 'K': push(integer(little_endian(1))); break;
        case 'M': push(integer(little_endian(2))); break;
        case 'J': push(integer(int32_t(uint32_t(little_endian(4))))); break;
        case 0x8a: push(integer(long_integer(byte(), at))); break;                   // LONG1
        case 0x8b: push(integer(long_integer(little_endian(4), at))); break;         // LONG4
        case 'G': { take(8); auto v = make(Value::kFloat); push(v); break; }        // BINFLOAT
        case 'X': push(string(little_endian(4))); break;                             // BINUNICODE
        case 0x8c: case 'U': case 'C': push(string(byte())); break;
        case 0x8d: case 0x8e: push(string(little_endian(8))); break;
        case 'T': case 'B': push(string(little_endian(4))); break;
        case 'q': memo_[little_endian(1)] = top(); break;                            // BINPUT
        case 'r': memo_[little_endian(4)] = top(); break;                            // LONG_BINPUT
        case 0x94: memo_[memo_.size()] = top(); break;                               // MEMOIZE
        case 'h': push(fetch(little_endian(1), at)); break;                          // BINGET
        case 'j': push(fetch(little_endian(4), at)); break;                          // LONG_BINGET
        case '0': pop(); break;
        case '1': pop_mark(); break;
        case '2': push(top()); break;
        case 'c': { auto m = line(); push(global(m, line(), at)); break; }
        case 0x93: { auto n = pop(), m = pop(); push(global(str(m, at), str(n, at), at)); break; }
        case 'Q': push(storage(pop(), at)); break;                                   // BINPERSID
        case 'R': { auto args = pop(); auto fn = pop(); push(reduce(fn, args, at)); break; }
        case 'b': pop(); break;  // BUILD: an OrderedDict's state (its _metadata) is not kept
        default: {
          char hex[8];
          std::snprintf(hex, sizeof hex, "0x%02x", op);
          bad(std::string("pickle opcode ") + hex + " is not read here (not a state dict?)", at);
        }
      }
    }
  }

 private:
  [[noreturn]] void bad(const std::string& what, size_t at) const {
    throw CheckpointError("torch.save file '" + path_ + "': data.pkl at byte " +
                          std::to_string(at) + ": " + what);
  }
  unsigned char byte() {
    if (pos_ >= b_.size()) bad("the pickle ends before its STOP", pos_);
    return static_cast<unsigned char>(b_[pos_++]);
  }
  std::string take(uint64_t n) {
    if (n > b_.size() - pos_) bad("the pickle ends inside a value", pos_);
    std::string s = b_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  uint64_t little_endian(int n) {
    const std::string s = take(n);
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[i]);
    return v;
  }
  int64_t long_integer(uint64_t n, size_t at) {
    if (n > 8) bad("an integer of " + std::to_string(n) + " bytes", at);
    if (n == 0) return 0;
    const std::string s = take(n);
    uint64_t v = 0;
    for (int i = int(n) - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[i]);
    if (n < 8 && (static_cast<unsigned char>(s[n - 1]) & 0x80)) v |= ~uint64_t(0) << (8 * n);
    return static_cast<int64_t>(v);
  }
  std::string line() {
    const size_t end = b_.find('\n', pos_);
    if (end == std::string::npos) bad("a GLOBAL without its newline", pos_);
    std::string s = b_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return s;
  }
  ValuePtr integer(int64_t i) {
    auto v = make(Value::kInt);
    v->integer = i;
    return v;
  }
  ValuePtr string(uint64_t n) {
    auto v = make(Value::kString);
    v->text = take(n);
    return v;
  }
  ValuePtr tuple_of(std::vector<ValuePtr> items) {
    auto v = make(Value::kTuple);
    v->items = std::move(items);
    return v;
  }
  void push(ValuePtr v) { stack_.push_back(std::move(v)); }
  ValuePtr top() {
    if (stack_.empty()) bad("a value taken from an empty stack", pos_);
    return stack_.back();
  }
  ValuePtr pop() {
    ValuePtr v = top();
    stack_.pop_back();
    return v;
  }
  std::vector<ValuePtr> pop_n(size_t n) {
    if (stack_.size() < n) bad("a tuple of more values than the stack holds", pos_);
    std::vector<ValuePtr> out(stack_.end() - n, stack_.end());
    stack_.resize(stack_.size() - n);
    return out;
  }
  std::vector<ValuePtr> pop_mark() {
    if (marks_.empty()) bad("no MARK to pop to", pos_);
    const size_t m = marks_.back();
    marks_.pop_back();
    return pop_n(stack_.size() - m);
  }
  ValuePtr list_top() {
    ValuePtr l = top();
    if (l->kind != Value::kList) bad("APPEND to something that is not a list", pos_);
    return l;
  }
  ValuePtr dict_top() {
    ValuePtr d = top();
    if (d->kind != Value::kDict) bad("SETITEM on something that is not a dict", pos_);
    return d;
  }
  ValuePtr fetch(uint64_t key, size_t at) {
    auto it = memo_.find(key);
    if (it == memo_.end()) bad("memo entry " + std::to_string(key) + " was never put", at);
    return it->second;
  }
  const std::string& str(const ValuePtr& v, size_t at) {
    if (v->kind != Value::kString) bad("STACK_GLOBAL of something that is not a string", at);
    return v->text;
  }
  ValuePtr global(const std::string& module, const std::string& name, size_t at) {
    auto v = make(Value::kGlobal);
    v->text = module + "." + name;
    if (module == "torch" && dtype_of_torch_storage_class(name) != at::ScalarType::Undefined) {
      v->dtype = dtype_of_torch_storage_class(name);
    } else if (!callables().count(v->text)) {
      bad("global " + v->text + " is not allowed in a weights file (only what a state dict of "
          "tensors needs, as torch.load(weights_only=True))",
          at);
    }
    return v;
  }
  int64_t int_of(const ValuePtr& v, const char* what, size_t at) {
    if (v->kind != Value::kInt) bad(std::string(what) + " is not an integer", at);
    return v->integer;
  }
  std::vector<int64_t> ints_of(const ValuePtr& v, const char* what, size_t at) {
    if (v->kind != Value::kTuple) bad(std::string(what) + " is not a tuple", at);
    std::vector<int64_t> out;
    for (const auto& i : v->items) out.push_back(int_of(i, what, at));
    return out;
  }
  // ('storage', torch.<Dtype>Storage, key, location, numel)
  ValuePtr storage(const ValuePtr& pid, size_t at) {
    const auto& p = pid->items;
    if (pid->kind != Value::kTuple || p.size() != 5 || p[0]->kind != Value::kString ||
        p[0]->text != "storage" || p[1]->kind != Value::kGlobal || p[1]->text.rfind("torch.", 0) ||
        p[2]->kind != Value::kString)
      bad("a persistent id that is not ('storage', torch.<Dtype>Storage, key, location, numel)",
          at);
    if (dtype_of_torch_storage_class(p[1]->text.substr(6)) == at::ScalarType::Undefined)
      bad(p[1]->text + " is not a storage class", at);
    auto v = make(Value::kStorage);
    v->dtype = p[1]->dtype;
    v->text = p[2]->text;
    v->integer = int_of(p[4], "a storage's size", at);
    return v;
  }
  ValuePtr reduce(const ValuePtr& fn, const ValuePtr& args, size_t at) {
    if (fn->kind != Value::kGlobal || args->kind != Value::kTuple)
      bad("REDUCE of something that is not an allowed global", at);
    const auto& a = args->items;
    if (fn->text == "collections.OrderedDict") {
      if (!a.empty()) bad("OrderedDict built from items (a state dict starts empty)", at);
      return make(Value::kDict);
    }
    if (fn->text == "torch._utils._rebuild_parameter") {
      if (a.empty() || a[0]->kind != Value::kTensor) bad("a Parameter without its tensor", at);
      return a[0];
    }
    if (fn->text == "torch._utils._rebuild_tensor_v2") {
      if (a.size() < 4 || a[0]->kind != Value::kStorage)
        bad("_rebuild_tensor_v2 without (storage, offset, size, stride, ...)", at);
      auto t = make(Value::kTensor);
      PickledTensor& pt = t->tensor;
      pt.dtype = a[0]->dtype;
      pt.storage_key = a[0]->text;
      pt.storage_numel = a[0]->integer;
      pt.storage_offset = int_of(a[1], "a tensor's storage offset", at);
      pt.shape = ints_of(a[2], "a tensor's size", at);
      pt.stride = ints_of(a[3], "a tensor's stride", at);
      if (pt.shape.size() != pt.stride.size())
        bad("a tensor's size and stride differ in length", at);
      return t;
    }
    bad("REDUCE of " + fn->text + " (a storage class is not called)", at);
  }

  const std::string& b_;
  const std::string& path_;
  size_t pos_ = 0;
  std::vector<ValuePtr> stack_;
  std::vector<size_t> marks_;
  std::map<uint64_t, ValuePtr> memo_;
};

}  // namespace

const char* torch_storage_class(at::ScalarType dtype) {
  for (const auto& s : kStorageClasses)
    if (s.type == dtype) return s.name;
  return nullptr;
}

at::ScalarType dtype_of_torch_storage_class(const std::string& name) {
  for (const auto& s : kStorageClasses)
    if (name == s.name) return s.type;
  return at::ScalarType::Undefined;
}

int64_t PickledTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

bool PickledTensor::contiguous() const {
  int64_t expected = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1 && stride[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

std::vector<PickledTensor> read_state_dict_pickle(const std::string& pickle,
                                                  const std::string& path) {
  const ValuePtr root = Unpickler(pickle, path).run();
  const std::string where = "torch.save file '" + path + "': ";
  if (root->kind != Value::kDict)
    throw CheckpointError(where + "holds no dict of tensors (a state dict) at its top");
  std::vector<PickledTensor> out;
  std::set<std::string> seen;
  for (const auto& [key, value] : root->entries) {
    if (key->kind != Value::kString)
      throw CheckpointError(where + "a key of its dict is not a string");
    if (value->kind != Value::kTensor)
      throw CheckpointError(where + "\"" + key->text + "\" holds " +
                            (value->kind == Value::kDict ? "a dict" : "something other") +
                            ", not a tensor (a whole training checkpoint, not a state dict? "
                            "save model.state_dict())");
    if (!seen.insert(key->text).second)
      throw CheckpointError(where + "\"" + key->text + "\" appears twice");
    out.push_back(value->tensor);
    out.back().name = key->text;
  }
  return out;
}

}  // namespace checkpoint
}  // namespace deepspeed
