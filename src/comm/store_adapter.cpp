#include "comm/store_adapter.h"

#include "comm/gloo_communicator.h"

namespace deepspeed {
namespace comm {

ForwardingStore::ForwardingStore(std::shared_ptr<c10d::Store> inner) : inner_(std::move(inner)) {
  c10d::Store::setTimeout(inner_->getTimeout());
}

void ForwardingStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  inner_->set(key, value);
}
std::vector<uint8_t> ForwardingStore::compareSet(const std::string& key,
                                                 const std::vector<uint8_t>& expected,
                                                 const std::vector<uint8_t>& desired) {
  return inner_->compareSet(key, expected, desired);
}
std::vector<uint8_t> ForwardingStore::get(const std::string& key) { return inner_->get(key); }
int64_t ForwardingStore::add(const std::string& key, int64_t value) {
  return inner_->add(key, value);
}
bool ForwardingStore::deleteKey(const std::string& key) { return inner_->deleteKey(key); }
bool ForwardingStore::check(const std::vector<std::string>& keys) { return inner_->check(keys); }
int64_t ForwardingStore::getNumKeys() { return inner_->getNumKeys(); }
void ForwardingStore::wait(const std::vector<std::string>& keys) { inner_->wait(keys); }
void ForwardingStore::wait(const std::vector<std::string>& keys,
                           const std::chrono::milliseconds& timeout) {
  inner_->wait(keys, timeout);
}
void ForwardingStore::setTimeout(const std::chrono::milliseconds& timeout) {
  c10d::Store::setTimeout(timeout);
  inner_->setTimeout(timeout);
}
c10::intrusive_ptr<c10d::Store> ForwardingStore::clone() {
  return c10::make_intrusive<ForwardingStore>(inner_);
}

CommunicatorPtr make_gloo_communicator(std::shared_ptr<c10d::Store> store, int rank, int world_size,
                                       std::chrono::milliseconds timeout, int local_rank) {
  c10::intrusive_ptr<c10d::Store> wrapped = c10::make_intrusive<ForwardingStore>(std::move(store));
  return make_gloo_communicator(wrapped, rank, world_size, timeout, local_rank);
}

}  // namespace comm
}  // namespace deepspeed
