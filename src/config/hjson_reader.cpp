// A recursive-descent reader for the hjson that DeepSpeed's config loader accepts. It follows the
// decisions of hjson-py 3.1's decoder (what is a value, where one ends, which input is an error)
// so that a file means the same here as there; the error messages are our own and carry the
// position. Values come out as nlohmann::json, non-negative integers as unsigned like
// nlohmann's own parser.
#include "config/hjson_reader.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <optional>
#include <string_view>

#include "config/json_reader.h"
#include "deepspeed/errors.h"

namespace deepspeed::config {
namespace {

using nlohmann::json;

constexpr int kEof = -1;

// What hjson itself rejects; a duplicate key is a plain ConfigError (DeepSpeed's duplicate check
// runs outside hjson, so hjson's fallback for a brace-less root never hides it).
class SyntaxError : public ConfigError {
 public:
  using ConfigError::ConfigError;
};

bool is_space(int c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(int c) { return c >= '0' && c <= '9'; }
bool is_punctuator(int c) {
  return c != kEof && std::string_view("{}[],:").find(char(c)) != std::string_view::npos;
}

// Python's str.strip() for the ASCII whitespace a config can hold.
std::string strip(std::string_view s) {
  const char* ws = " \t\n\r\v\f";
  size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return "";
  return std::string(s.substr(b, s.find_last_not_of(ws) - b + 1));
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

class HjsonParser {
 public:
  HjsonParser(const std::string& text, const std::string& source) : s_(text), source_(source) {}

  json parse_document() {
    check_utf8();
    if (s_.compare(0, 3, "\xEF\xBB\xBF") == 0) pos_ = 3;  // UTF-8 byte order mark
    skip_space();
    if (at_end()) return json::object();  // empty or comments only: hjson reads {}
    json doc;
    if (peek() == '{' || peek() == '[') {
      doc = parse_value("");
    } else {
      doc = parse_root_without_braces();
    }
    skip_space();
    if (!at_end()) fail(pos_, "text after the end of the document");
    return doc;
  }

 private:
  int peek(size_t offset = 0) const {
    size_t i = pos_ + offset;
    return i < s_.size() ? static_cast<unsigned char>(s_[i]) : kEof;
  }
  bool at_end() const { return pos_ >= s_.size(); }

  // "line L, column C (byte B)", 1-based like editors; the column counts bytes.
  std::string where(size_t byte) const {
    size_t line = 1, column = 1;
    for (size_t i = 0; i < byte && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    return "line " + std::to_string(line) + ", column " + std::to_string(column) + " (byte " +
           std::to_string(byte) + ")";
  }

  [[noreturn]] void fail(size_t byte, const std::string& what) const {
    throw SyntaxError("DeepSpeed config file '" + source_ + "' is not valid JSON or hjson at " +
                      where(byte) + ": " + what);
  }

  // DeepSpeed opens the file as text, and Python's UTF-8 decoder refuses it (UnicodeDecodeError)
  // wherever a byte is not UTF-8, comments included. Kept, such a byte would load here and then
  // make every save_checkpoint throw when it writes the config into its metadata.
  void check_utf8() const {
    size_t bad = first_invalid_utf8(s_);
    if (bad == std::string_view::npos) return;
    static const char* kHex = "0123456789ABCDEF";
    unsigned char b = static_cast<unsigned char>(s_[bad]);
    fail(bad, std::string("byte 0x") + kHex[b >> 4] + kHex[b & 15] +
                  " is not valid UTF-8 (a file saved as Latin-1 or another 8-bit encoding?); "
                  "DeepSpeed reads config files as UTF-8: save it as UTF-8");
  }

  // Whitespace and comments: # and // to the end of the line, /* to */.
  void skip_space() {
    for (;;) {
      while (!at_end() && is_space(peek())) ++pos_;
      if (peek() == '#' || (peek() == '/' && peek(1) == '/')) {
        while (!at_end() && peek() != '\n' && peek() != '\r') ++pos_;
      } else if (peek() == '/' && peek(1) == '*') {
        size_t open = pos_;
        pos_ += 2;
        while (!at_end() && !(peek() == '*' && peek(1) == '/')) ++pos_;
        if (at_end()) fail(open, "a /* comment that is never closed with */");
        pos_ += 2;
      } else {
        return;
      }
    }
  }

  // hjson lets the root object go without braces; failing that, the file may hold one value.
  json parse_root_without_braces() {
    size_t start = pos_;
    try {
      return parse_object("", /*braces=*/false, start);
    } catch (const SyntaxError&) {
      std::exception_ptr first = std::current_exception();
      pos_ = start;
      try {
        json value = parse_value("");
        skip_space();
        if (at_end()) return value;
      } catch (const SyntaxError&) {
      }
      // Both readings fail (hjson itself then reports "Extra data" or the object's error): the
      // object's error says more about a config file.
      std::rethrow_exception(first);
    }
  }

  // REQUIRES: whitespace before the value is skipped.
  json parse_value(const std::string& path) {
    int c = peek();
    if (c == '\'' && s_.compare(pos_, 3, "'''") == 0) return parse_multiline();
    if (c == '"' || c == '\'') return parse_quoted();
    if (c == '{') {
      size_t open = pos_++;
      return parse_object(path, /*braces=*/true, open);
    }
    if (c == '[') {
      size_t open = pos_++;
      return parse_array(path, open);
    }
    return parse_quoteless();
  }

  // Members need no comma between them, and a comma may trail the last one.
  json parse_object(const std::string& path, bool braces, size_t open) {
    json obj = json::object();
    skip_space();
    if (braces && peek() == '}') {
      ++pos_;
      return obj;
    }
    for (;;) {
      if (braces && at_end()) {
        fail(pos_,
             "the file ends inside the object opened at " + where(open) + "; a '}' is missing");
      }
      size_t key_at = pos_;
      std::string key = parse_key();
      skip_space();
      if (peek() != ':') fail(pos_, "expected ':' after the key \"" + key + "\"");
      ++pos_;
      skip_space();
      std::string key_path = join_path(path, key);
      json value = parse_value(key_path);
      if (obj.contains(key)) {
        throw ConfigError("DeepSpeed config file '" + source_ + "' gives key '" + key_path +
                          "' twice (again at " + where(key_at) + "); keep one");
      }
      obj[key] = std::move(value);
      skip_space();
      if (peek() == ',') {
        ++pos_;
        skip_space();
      }
      if (!braces && at_end()) break;
      if (braces && peek() == '}') {
        ++pos_;
        break;
      }
    }
    return obj;
  }

  json parse_array(const std::string& path, size_t open) {
    json arr = json::array();
    skip_space();
    if (peek() == ']') {
      ++pos_;
      return arr;
    }
    for (;;) {
      if (at_end()) {
        fail(pos_, "the file ends inside the list opened at " + where(open) + "; a ']' is missing");
      }
      arr.push_back(parse_value(path + "[" + std::to_string(arr.size()) + "]"));
      skip_space();
      if (peek() == ',') {
        ++pos_;
        skip_space();
      }
      if (peek() == ']') {
        ++pos_;
        break;
      }
    }
    return arr;
  }

  // A quoted key, or a quoteless one: everything up to ':', without {}[], or inner whitespace.
  std::string parse_key() {
    if (peek() == '"' || peek() == '\'') return parse_quoted();
    size_t begin = pos_;
    size_t space = std::string::npos;  // start of the last whitespace run seen
    for (;; ++pos_) {
      int c = peek();
      if (c == kEof) {
        fail(begin, "the file ends inside the key name \"" + strip(s_.substr(begin)) + "\"");
      }
      if (c == ':') {
        if (pos_ == begin) fail(begin, "found ':' with no key name before it");
        if (space != std::string::npos && space != pos_ - 1) {
          fail(space, "whitespace inside the key name \"" + strip(s_.substr(begin, pos_ - begin)) +
                          "\"; quote a key that holds spaces");
        }
        return strip(s_.substr(begin, pos_ - begin));
      }
      if (is_space(c)) {
        if (space == std::string::npos || space == pos_ - 1) space = pos_;
      } else if (is_punctuator(c)) {
        fail(begin, std::string("found '") + char(c) +
                        "' where a key name was expected (a quoteless key runs to ':' and cannot "
                        "hold {}[], or spaces; check the syntax or quote the key)");
      }
    }
  }

  // "..." or '...': JSON escapes plus \' ; raw control characters are an error.
  std::string parse_quoted() {
    size_t begin = pos_;
    char quote = s_[pos_++];
    std::string out;
    for (;;) {
      if (at_end()) fail(begin, std::string("a string that is never closed with ") + quote);
      int c = peek();
      if (c == quote) {
        ++pos_;
        return out;
      }
      if (c < 0x20) {
        fail(pos_, "a control character (byte " + std::to_string(c) +
                       ") inside a quoted string; write it as an escape such as \\n or \\t");
      }
      if (c != '\\') {
        out += char(c);
        ++pos_;
        continue;
      }
      int e = peek(1);
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\'':
          out += '\'';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          size_t escape = pos_;
          pos_ += 2;
          uint32_t cp = hex4(escape);
          // A high surrogate followed by \u and a low surrogate is one code point.
          if ((cp & 0xFC00) == 0xD800 && peek() == '\\' && peek(1) == 'u') {
            size_t save = pos_;
            pos_ += 2;
            uint32_t low = hex4(save);
            if ((low & 0xFC00) == 0xDC00) {
              cp = 0x10000 + (((cp - 0xD800) << 10) | (low - 0xDC00));
            } else {
              pos_ = save;
            }
          }
          // hjson-py keeps a lone surrogate in its str (json.dumps writes it back as the same
          // escape); UTF-8 has no encoding for one, so nlohmann could not write it out again.
          // No real setting is a lone surrogate: refused, at the escape.
          if ((cp & 0xF800) == 0xD800) {
            fail(escape, "\\u" + s_.substr(escape + 2, 4) +
                             " is half of a UTF-16 surrogate pair with no other half; a string "
                             "holds UTF-8 text only, so write the character itself or a full "
                             "pair such as \\ud83d\\ude00");
          }
          append_utf8(out, cp);
          continue;
        }
        case kEof:
          fail(begin, std::string("a string that is never closed with ") + quote);
        default:
          fail(pos_, std::string("invalid escape \\") + char(e) + " in a string");
      }
      pos_ += 2;
    }
  }

  uint32_t hex4(size_t escape) {
    uint32_t cp = 0;
    for (int i = 0; i < 4; ++i) {
      int c = peek();
      int d = is_digit(c)              ? c - '0'
              : (c >= 'a' && c <= 'f') ? c - 'a' + 10
              : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                                       : -1;
      if (d < 0) fail(escape, "invalid \\u escape; expected four hex digits");
      cp = cp * 16 + uint32_t(d);
      ++pos_;
    }
    return cp;
  }

  // Advances past up to n (n < 0: any number of) spaces, tabs and carriage returns.
  void skip_indent(long n) {
    while (!at_end() && (peek() == ' ' || peek() == '\t' || peek() == '\r') && n != 0) {
      ++pos_;
      --n;
    }
  }

  // '''...''': the indentation of the opening ''' is removed from each following line, a first
  // line break and a last one are dropped.
  std::string parse_multiline() {
    size_t open = pos_;
    size_t line_start = pos_ == 0 ? std::string::npos : s_.rfind('\n', pos_ - 1);
    long indent = long(line_start == std::string::npos ? pos_ : pos_ - line_start - 1);
    pos_ += 3;
    skip_indent(-1);
    if (peek() == '\n') {
      ++pos_;
      skip_indent(indent);
    }
    std::string out;
    int quotes = 0;
    for (;;) {
      int c = peek();
      if (c == kEof) fail(open, "a ''' string that is never closed with '''");
      if (c == '\'') {
        ++pos_;
        if (++quotes == 3) {
          if (!out.empty() && out.back() == '\n') out.pop_back();
          return out;
        }
        continue;
      }
      out.append(size_t(quotes), '\'');
      quotes = 0;
      if (c == '\n') {
        out += '\n';
        ++pos_;
        skip_indent(indent);
      } else {
        if (c != '\r') out += char(c);
        ++pos_;
      }
    }
  }

  // true, false, null, a number, or a quoteless string. The first four end at a stop character
  // (line end, , } ] # // /*); anything else runs on to the end of the line, stops included.
  json parse_quoteless() {
    size_t begin = pos_;
    int first = peek();
    if (first == kEof) fail(pos_, "the file ends where a value was expected");
    if (is_punctuator(first)) {
      fail(pos_, std::string("found '") + char(first) + "' where a value was expected");
    }
    for (size_t end = begin;; ++end) {
      int c = end < s_.size() ? static_cast<unsigned char>(s_[end]) : kEof;
      bool eol = c == kEof || c == '\n' || c == '\r';
      int next = end + 1 < s_.size() ? s_[end + 1] : kEof;
      bool stop = eol || c == ',' || c == '}' || c == ']' || c == '#' ||
                  (c == '/' && (next == '/' || next == '*'));
      if (!stop) continue;
      std::string token = strip(std::string_view(s_).substr(begin, end - begin));
      std::optional<json> value;
      if (first == 'n' && token == "null") value = json(nullptr);
      if (first == 't' && token == "true") value = json(true);
      if (first == 'f' && token == "false") value = json(false);
      if (first == '-' || is_digit(first)) value = number(begin, end);
      if (value) {
        pos_ = end;
        return *value;
      }
      if (eol) {
        pos_ = end;
        return json(token);
      }
    }
  }

  // -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][-+]?[0-9]+)? followed only by spaces/tabs up to `end`.
  // Like hjson-py, a number with a fraction or exponent that is integral and below 1e10 in
  // magnitude is an integer (5e8 → 500000000, 1.0 → 1).
  std::optional<json> number(size_t begin, size_t end) const {
    auto digit_at = [&](size_t i) { return i < end && is_digit(s_[i]); };
    size_t i = begin;
    if (i < end && s_[i] == '-') ++i;
    if (!digit_at(i)) return std::nullopt;
    if (s_[i] == '0') {
      ++i;
    } else {
      while (digit_at(i)) ++i;
    }
    bool real = false;
    if (i < end && s_[i] == '.' && digit_at(i + 1)) {
      real = true;
      for (++i; digit_at(i);) ++i;
    }
    if (i < end && (s_[i] == 'e' || s_[i] == 'E')) {
      size_t j = i + 1;
      if (j < end && (s_[j] == '+' || s_[j] == '-')) ++j;
      if (digit_at(j)) {
        real = true;
        for (i = j; digit_at(i);) ++i;
      }
    }
    size_t num_end = i;
    while (i < end && (s_[i] == ' ' || s_[i] == '\t')) ++i;
    if (i != end) return std::nullopt;
    std::string text = s_.substr(begin, num_end - begin);
    if (!real) {
      if (text[0] == '-') {
        int64_t v = 0;
        auto r = std::from_chars(text.data(), text.data() + text.size(), v);
        if (r.ec == std::errc()) return json(v);
      } else {
        uint64_t v = 0;
        auto r = std::from_chars(text.data(), text.data() + text.size(), v);
        if (r.ec == std::errc()) return json(v);
      }
      return json(std::strtod(text.c_str(), nullptr));  // beyond 64 bits
    }
    double d = std::strtod(text.c_str(), nullptr);
    if (!std::isfinite(d)) fail(begin, "the number " + text + " is out of range");
    if (std::floor(d) == d && std::fabs(d) < 1e10) {
      if (d < 0) return json(static_cast<int64_t>(d));
      return json(static_cast<uint64_t>(d));
    }
    return json(d);
  }

  const std::string& s_;
  const std::string& source_;
  size_t pos_ = 0;
};

}  // namespace

nlohmann::json parse_hjson(const std::string& text, const std::string& source) {
  return HjsonParser(text, source).parse_document();
}

}  // namespace deepspeed::config
