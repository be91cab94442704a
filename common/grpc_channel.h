// Channel arguments for the long-lived channels between lazyrag services (router -> workers,
// workers -> kvstore shards and peer workers).
#pragma once

#include <grpcpp/support/channel_arguments.h>

namespace lazyrag {

// Message limits of `max_message_bytes` both ways; reconnect backoff 100 ms to 1 s, so a
// restarted server is found again within about a second instead of after gRPC's default
// backoff (up to two minutes); a subchannel pool of the channel's own, so that channels to the
// same address never share (and never stall on) one connection.
grpc::ChannelArguments ServiceChannelArgs(int max_message_bytes);

}  // namespace lazyrag
