#include "cli/kv_command.h"

#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/auth_flags.h"
#include "kvstore/client/kvstore_client.h"

namespace lazyrag::cli {
namespace {

constexpr char kUsage[] =
    "usage: lazyrag-cli kv put|get|stat|delete --kvstore ADDR[,ADDR...] --key NAME\n"
    "           [--key NAME ...] [--file PATH] [--replication R] [--timeout_s S]\n"
    "           [--auth_token_file F]  (a worker token, for shards with --auth_tokens_file)\n"
    "  put     store the bytes of --file (stdin without it) under the raw key NAME\n"
    "  get     write the value of NAME to --file (stdout without it)\n"
    "  stat    print 'NAME present|absent SIZE LAST_ACCESS_UNIX_MS REPLICAS' per key\n"
    "  delete  delete NAME from every replica\n";

struct KvArgs {
  std::string command;
  std::string shards;
  std::vector<std::string> keys;
  std::string file;
  int replication = 0;
  double timeout_s = 300;
  std::string auth_token_file;
};

int Usage(const std::string& problem) {
  if (!problem.empty()) std::cerr << "lazyrag-cli kv: " << problem << "\n";
  std::cerr << kUsage;
  return 2;
}

// Accepts "--flag value" and "--flag=value". Returns false with `error` set on bad input.
bool ParseArgs(int argc, char** argv, KvArgs* args, std::string* error) {
  if (argc < 2) {
    *error = "missing subcommand";
    return false;
  }
  args->command = argv[1];
  for (int i = 2; i < argc; ++i) {
    std::string arg = argv[i];
    std::string value;
    const size_t eq = arg.find('=');
    if (arg.rfind("--", 0) != 0) {
      *error = absl::StrCat("unexpected argument '", arg, "'");
      return false;
    }
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      *error = absl::StrCat(arg, " needs a value");
      return false;
    }
    if (arg == "--kvstore") {
      args->shards = value;
    } else if (arg == "--key") {
      args->keys.push_back(value);
    } else if (arg == "--auth_token_file") {
      args->auth_token_file = value;
    } else if (arg == "--file") {
      args->file = value;
    } else if (arg == "--replication") {
      if (!absl::SimpleAtoi(value, &args->replication) || args->replication < 0) {
        *error = "--replication wants a number";
        return false;
      }
    } else if (arg == "--timeout_s") {
      if (!absl::SimpleAtod(value, &args->timeout_s) || args->timeout_s <= 0) {
        *error = "--timeout_s wants a positive number";
        return false;
      }
    } else {
      *error = absl::StrCat("unknown flag ", arg);
      return false;
    }
  }
  return true;
}

int Fail(const absl::Status& status) {
  std::cerr << "lazyrag-cli kv: " << status << "\n";
  return status.code() == absl::StatusCode::kNotFound ? 3 : 1;
}

}  // namespace

int RunKvCommand(int argc, char** argv) {
  KvArgs args;
  std::string error;
  if (!ParseArgs(argc, argv, &args, &error)) return Usage(error);
  const std::string& cmd = args.command;
  if (cmd != "put" && cmd != "get" && cmd != "stat" && cmd != "delete") {
    return Usage(absl::StrCat("unknown subcommand '", cmd, "'"));
  }
  if (args.shards.empty()) return Usage("--kvstore is required");
  if (args.keys.empty()) return Usage("--key is required");
  if (cmd != "stat" && args.keys.size() != 1) return Usage("give exactly one --key");

  kvstore::KvClientOptions options;
  options.shards = kvstore::SplitShardList(args.shards);
  auto token = OpenBearerToken(args.auth_token_file);
  if (!token.ok()) return Usage(std::string(token.status().message()));
  options.auth_token = *token;
  options.replication = args.replication;
  options.call_timeout = absl::Seconds(args.timeout_s);
  auto client = kvstore::KvClient::Create(options);
  if (!client.ok()) return Fail(client.status());
  const kvstore::Key key = kvstore::Key::Raw(args.keys[0]);

  if (cmd == "put") {
    std::string value;
    if (args.file.empty()) {
      value.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    } else {
      std::ifstream in(args.file, std::ios::binary);
      if (!in) return Fail(absl::NotFoundError(absl::StrCat("cannot open ", args.file)));
      in.seekg(0, std::ios::end);
      value.resize(static_cast<size_t>(in.tellg()));
      in.seekg(0);
      in.read(value.data(), static_cast<std::streamsize>(value.size()));
      if (!in) return Fail(absl::DataLossError(absl::StrCat("cannot read ", args.file)));
    }
    absl::Status st = (*client)->Put(key, {}, value);
    if (!st.ok()) return Fail(st);
    std::cerr << "stored " << value.size() << " bytes under '" << args.keys[0] << "'\n";
    return 0;
  }
  if (cmd == "get") {
    auto value = (*client)->Get(key);
    if (!value.ok()) return Fail(value.status());
    if (args.file.empty()) {
      std::cout.write(value->bytes.data(), static_cast<std::streamsize>(value->bytes.size()));
      std::cout.flush();
      return std::cout ? 0 : 1;
    }
    const std::string tmp = args.file + ".partial";
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out.write(value->bytes.data(), static_cast<std::streamsize>(value->bytes.size()));
      if (!out) {
        std::remove(tmp.c_str());
        return Fail(absl::UnavailableError(absl::StrCat("cannot write ", tmp)));
      }
    }
    // Never leave a half-written file under the asked name.
    if (std::rename(tmp.c_str(), args.file.c_str()) != 0) {
      return Fail(absl::UnavailableError(absl::StrCat("cannot rename to ", args.file)));
    }
    return 0;
  }
  if (cmd == "stat") {
    std::vector<kvstore::Key> keys;
    for (const auto& k : args.keys) keys.push_back(kvstore::Key::Raw(k));
    auto infos = (*client)->Stat(keys);
    if (!infos.ok()) return Fail(infos.status());
    for (size_t i = 0; i < keys.size(); ++i) {
      const auto& info = (*infos)[i];
      std::cout << args.keys[i] << " " << (info.present ? "present" : "absent") << " " << info.size
                << " " << info.last_access_unix_ms << " " << info.replicas_present << "\n";
    }
    return 0;
  }
  auto existed = (*client)->Delete(key);
  if (!existed.ok()) return Fail(existed.status());
  std::cerr << (*existed ? "deleted '" : "not stored: '") << args.keys[0] << "'\n";
  return 0;
}

}  // namespace lazyrag::cli
