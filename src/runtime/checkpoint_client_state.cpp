// save_checkpoint's client_state as it is stored in the model-states file's JSON metadata, and
// back. JSON has no inf or NaN (nlohmann writes them as null, so {"best_loss": inf} would come
// back as null; DeepSpeed pickles client_state and gets them back): each is stored as the object
// {"__ds_non_finite__": "inf" | "-inf" | "nan"} and turned back into the number at the load.
#include <cmath>
#include <limits>

#include "deepspeed/errors.h"
#include "runtime/engine_checkpoint.h"

namespace deepspeed {
namespace checkpoint {
namespace {

using json = nlohmann::json;

// A JSON pointer's reference token (RFC 6901): '~' as "~0", '/' as "~1".
std::string pointer_token(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c == '~')
      out += "~0";
    else if (c == '/')
      out += "~1";
    else
      out += c;
  }
  return out;
}

std::string where(const std::string& pointer) {
  return "client_state at JSON pointer \"" + pointer + "\"";
}

// nlohmann refuses to write a string that is not UTF-8 (type_error 316).
bool is_utf8(const std::string& text) {
  try {
    (void)json(text).dump();
    return true;
  } catch (const json::type_error&) {
    return false;
  }
}

void encode(json& j, const std::string& pointer) {
  if (j.is_number_float()) {
    const double v = j.get<double>();
    if (!std::isfinite(v)) j = {{kNonFiniteKey, std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf"}};
  } else if (j.is_string()) {
    if (!is_utf8(j.get_ref<const std::string&>()))
      throw CheckpointError("save_checkpoint: " + where(pointer) +
                            " is a string that is not valid UTF-8; JSON (the checkpoint's "
                            "metadata) holds UTF-8 text only: store bytes as numbers or base64");
  } else if (j.is_object()) {
    for (auto& [key, value] : j.items()) {
      if (!is_utf8(key))
        throw CheckpointError("save_checkpoint: " + where(pointer) +
                              " has a key that is not valid UTF-8; JSON (the checkpoint's "
                              "metadata) holds UTF-8 text only");
      if (key == kNonFiniteKey)
        throw CheckpointError("save_checkpoint: " + where(pointer) + " has the key \"" +
                              kNonFiniteKey +
                              "\", which checkpoints reserve to store inf, -inf and NaN; rename it");
      encode(value, pointer + "/" + pointer_token(key));
    }
  } else if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) encode(j[i], pointer + "/" + std::to_string(i));
  } else if (j.is_binary()) {
    throw CheckpointError("save_checkpoint: " + where(pointer) +
                          " is a binary value, which JSON cannot hold: store it as numbers or "
                          "base64");
  }
}

void decode(json& j, const std::string& pointer, const std::string& source) {
  if (j.is_object() && j.size() == 1 && j.contains(kNonFiniteKey)) {
    const json& v = j.at(kNonFiniteKey);
    const std::string text = v.is_string() ? v.get<std::string>() : std::string();
    if (text == "inf")
      j = std::numeric_limits<double>::infinity();
    else if (text == "-inf")
      j = -std::numeric_limits<double>::infinity();
    else if (text == "nan")
      j = std::numeric_limits<double>::quiet_NaN();
    else
      throw CheckpointError(source + ": " + where(pointer) + ": \"" + kNonFiniteKey +
                            "\" must be \"inf\", \"-inf\" or \"nan\", not " + v.dump());
  } else if (j.is_object()) {
    for (auto& [key, value] : j.items()) decode(value, pointer + "/" + pointer_token(key), source);
  } else if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) decode(j[i], pointer + "/" + std::to_string(i), source);
  }
}

}  // namespace

json client_state_to_save(const json& client_state) {
  json out = client_state;
  encode(out, "");
  return out;
}

json client_state_from_saved(const json& saved, const std::string& source) {
  json out = saved;
  decode(out, "", source);
  return out;
}

}  // namespace checkpoint
}  // namespace deepspeed
