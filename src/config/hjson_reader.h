// The text of a ds_config file → JSON, read the way DeepSpeed reads it. DeepSpeed loads config
// files with hjson (hjson-py 3.1), so a file that runs there loads here: comments (#, //, /* */),
// commas left out or left trailing, quoteless keys and values, single-quoted and ''' strings.
// The exact rules are in docs/config.md ("File syntax"); the notable one: a quoteless value runs
// to the end of its line unless it is exactly a number, true, false or null, so `"stage": two,`
// is the string "two," (then rejected by the key's type check, naming the key).
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace deepspeed::config {

// Parses `text`, the content of the file `source` (named in errors). Throws ConfigError naming
// the source, line, column and byte offset of the first syntax error hjson rejects, or the path
// of a key given twice in one object (DeepSpeed rejects duplicates too).
nlohmann::json parse_hjson(const std::string& text, const std::string& source);

}  // namespace deepspeed::config
