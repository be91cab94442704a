#include "common/grpc_auth.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/support/client_interceptor.h>

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace lazyrag {
namespace {

// Adds the bearer token to the initial metadata of each call of its channel.
class BearerInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit BearerInterceptor(BearerToken* token) : token_(token) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({"authorization", token_->Header()});
    }
    methods->Proceed();
  }

 private:
  BearerToken* const token_;
};

class BearerInterceptorFactory : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerInterceptorFactory(std::shared_ptr<BearerToken> token)
      : token_(std::move(token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new BearerInterceptor(token_.get());
  }

 private:
  const std::shared_ptr<BearerToken> token_;  // outlives the channel's interceptors
};

}  // namespace

absl::StatusOr<Identity> AuthenticateCall(TokenStore* tokens, const grpc::ServerContext& context,
                                          Role required) {
  if (tokens == nullptr) return Identity{};
  std::optional<std::string_view> bearer;
  auto range = context.client_metadata().equal_range("authorization");
  for (auto it = range.first; it != range.second; ++it) {
    bearer = BearerTokenOf(std::string_view(it->second.data(), it->second.size()));
    if (bearer.has_value()) break;
  }
  return tokens->Authenticate(bearer, required);
}

std::shared_ptr<grpc::Channel> CreateServiceChannel(
    const std::string& address, const std::shared_ptr<grpc::ChannelCredentials>& credentials,
    const grpc::ChannelArguments& args, std::shared_ptr<BearerToken> token) {
  if (token == nullptr) return grpc::CreateCustomChannel(address, credentials, args);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> factories;
  factories.push_back(std::make_unique<BearerInterceptorFactory>(std::move(token)));
  return grpc::experimental::CreateCustomChannelWithInterceptors(address, credentials, args,
                                                                 std::move(factories));
}

void AddBearerToken(grpc::ClientContext& context, BearerToken* token) {
  if (token != nullptr) context.AddMetadata("authorization", token->Header());
}

}  // namespace lazyrag
