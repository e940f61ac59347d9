# Checks of scripts/prereqs, as functions of a filesystem root so that tests can run them
# against a fake one. Sourced; defines functions only.

# libclang_present ROOT: succeeds when ROOT ("/" for this machine) holds a libclang that
# bindgen can load at run time, as clang-sys looks for it when LIBCLANG_PATH is unset: the
# directories /usr/local/llvm*/lib*, /usr/local/lib*[/*[/*]] and /usr/lib*[/*[/*]], and the
# names libclang.so, libclang-*.so, libclang.so.* and libclang-*.so.*, except libclang-cpp
# (another library, which clang-sys skips).
libclang_present() {
    local root=${1%/}
    local nullglob dir file
    nullglob=$(shopt -p nullglob || true)
    shopt -s nullglob
    for dir in "$root"/usr/local/llvm*/lib* \
        "$root"/usr/local/lib*/*/* "$root"/usr/local/lib*/* "$root"/usr/local/lib* \
        "$root"/usr/lib*/*/* "$root"/usr/lib*/* "$root"/usr/lib*; do
        [ -d "$dir" ] || continue
        for file in "$dir"/libclang.so "$dir"/libclang-*.so "$dir"/libclang.so.* "$dir"/libclang-*.so.*; do
            case ${file##*/} in
                *-cpp.*) continue ;;
            esac
            if [ -e "$file" ]; then
                eval "$nullglob"
                return 0
            fi
        done
    done
    eval "$nullglob"
    return 1
}

# json_server_present PREFIX VERSION: succeeds when PREFIX (an npm prefix) holds json-server
# VERSION, installed by `npm install --prefix PREFIX json-server@VERSION`: its package.json
# names that version and its command is linked in node_modules/.bin.
json_server_present() {
    local prefix=${1%/} version=$2
    local manifest="$prefix/node_modules/json-server/package.json"
    [ -x "$prefix/node_modules/.bin/json-server" ] || return 1
    [ -f "$manifest" ] || return 1
    grep -Eq "^[[:space:]]*\"version\"[[:space:]]*:[[:space:]]*\"${version//./\\.}\"" "$manifest"
}
