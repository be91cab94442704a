// `lazyrag-cli kv`: operator access to the kvstore with raw keys.
#pragma once

namespace lazyrag::cli {

// lazyrag-cli kv put|get|stat|delete --kvstore ADDR[,ADDR...] --key NAME [--key NAME...]
//     [--file PATH] [--replication R] [--timeout_s S]
// put reads the value from --file (stdin without it); get writes it to --file (stdout without
// it); stat prints one line per key; delete removes the key from every replica.
// `argv[0]` is "kv". Returns the process exit code: 0 success, 1 failure, 2 usage error,
// 3 key not found.
int RunKvCommand(int argc, char** argv);

}  // namespace lazyrag::cli
