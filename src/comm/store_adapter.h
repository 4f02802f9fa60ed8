// c10d stores are intrusively reference-counted; ForwardingStore lets a store owned by a
// std::shared_ptr be handed to c10d, which wants a c10::intrusive_ptr<Store>.
#pragma once
#include <memory>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace deepspeed {
namespace comm {

class ForwardingStore : public c10d::Store {
 public:
  explicit ForwardingStore(std::shared_ptr<c10d::Store> inner);

  // No `override` on purpose: the set of virtuals differs between libtorch 1.13 and 2.x; a
  // signature the base lacks is then just an extra member instead of a compile error.
  void set(const std::string& key, const std::vector<uint8_t>& value);
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired);
  std::vector<uint8_t> get(const std::string& key);
  int64_t add(const std::string& key, int64_t value);
  bool deleteKey(const std::string& key);
  bool check(const std::vector<std::string>& keys);
  int64_t getNumKeys();
  void wait(const std::vector<std::string>& keys);
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout);
  void setTimeout(const std::chrono::milliseconds& timeout);
  c10::intrusive_ptr<c10d::Store> clone();

 private:
  std::shared_ptr<c10d::Store> inner_;
};

}  // namespace comm
}  // namespace deepspeed
