// How gRPC parses the requests of lazyrag's services: as protobuf always does, but a request
// that does not parse gets INVALID_ARGUMENT with a message naming the message type, instead of
// gRPC's default INTERNAL with an empty message. The usual cause is a proto3 `string` field
// holding bytes that are not UTF-8, which protobuf refuses before any service code runs.
//
// Explicit specializations of grpc::SerializationTraits: for grpc::protobuf::MessageLite (the
// generated unary handlers and stubs parse every unary request through it) and for the four
// requests of streaming methods (their handlers parse through the concrete type). Serializing is
// unchanged. They must be seen before any use of those traits, so proto/CMakeLists.txt inserts
// `#include "lazyrag_wire_traits.h"` at the top of every generated *.grpc.pb.h (the only way code
// reaches the service and stub templates). A client that receives a response it cannot parse gets
// the same INVALID_ARGUMENT (our servers only send what they parsed or built).
#pragma once

#include <grpcpp/impl/codegen/proto_utils.h>

#include <string>

#include "lazyrag/v1/inference.pb.h"
#include "lazyrag/v1/kvstore.pb.h"
#include "lazyrag/v1/peer.pb.h"

namespace lazyrag::wire {

template <class T>
grpc::Status DeserializeMessage(grpc::ByteBuffer* buffer, grpc::protobuf::MessageLite* msg) {
  grpc::Status s = grpc::GenericDeserialize<grpc::ProtoBufferReader, T>(buffer, msg);
  if (s.ok() || s.error_code() != grpc::StatusCode::INTERNAL) return s;
  std::string what = "the message does not parse as ";
  what += msg->GetTypeName();
  what += ": malformed protobuf, or a string field that is not valid UTF-8";
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, what);
}

}  // namespace lazyrag::wire

#define LAZYRAG_WIRE_MESSAGE(T)                                                                   \
  template <>                                                                                     \
  class grpc::SerializationTraits<T, void> {                                                      \
   public:                                                                                        \
    static grpc::Status Serialize(const grpc::protobuf::MessageLite& msg, grpc::ByteBuffer* bb,   \
                                  bool* own_buffer) {                                             \
      return grpc::GenericSerialize<grpc::ProtoBufferWriter, T>(msg, bb, own_buffer);             \
    }                                                                                             \
    static grpc::Status Deserialize(grpc::ByteBuffer* buffer, grpc::protobuf::MessageLite* msg) { \
      return lazyrag::wire::DeserializeMessage<T>(buffer, msg);                                   \
    }                                                                                             \
  };

LAZYRAG_WIRE_MESSAGE(grpc::protobuf::MessageLite)
LAZYRAG_WIRE_MESSAGE(lazyrag::v1::GenerateRequest)  // Inference.Generate, server streaming
LAZYRAG_WIRE_MESSAGE(lazyrag::v1::PutRequest)       // KvStore.Put, client streaming
LAZYRAG_WIRE_MESSAGE(lazyrag::v1::GetRequest)       // KvStore.Get, server streaming
LAZYRAG_WIRE_MESSAGE(lazyrag::v1::PeerGetRequest)   // PeerDocuments.GetDocument, server streaming

#undef LAZYRAG_WIRE_MESSAGE
