# tfdist: the two commands a newcomer needs are `make demo` and `make test`.
# Both install TensorFlow 2.18.0's C library first when it is missing
# (scripts/libtensorflow.sh; cached under ~/.cache/tfdist).

SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
GO ?= go
# TensorFlow's C++ runtime logs INFO lines by default; keep warnings and errors.
export TF_CPP_MIN_LOG_LEVEL ?= 1
TFENV = eval "$$(scripts/libtensorflow.sh)" &&
TEST_FLAGS ?= -race -count=1 -timeout 40m

.PHONY: all demo test check vet fmt-check build libtensorflow env bench soak fuzz notebooks notebooks-save

all: build

## libtensorflow: find or install TensorFlow 2.18.0's C library and print the exports.
libtensorflow:
	@scripts/libtensorflow.sh

## env: print the exports to build by hand: eval "$$(make -s env)".
env:
	@scripts/libtensorflow.sh 2>/dev/null

build:
	@$(TFENV) $(GO) build ./...

## demo: train the digits classifier with the Mirrored strategy on 2 logical CPUs.
demo:
	@$(TFENV) $(GO) run ./examples/classifier -strategy mirrored -devices 2

## test: vet, format check and every test with the race detector.
test: fmt-check
	@$(TFENV) $(GO) vet ./... && $(GO) test $(TEST_FLAGS) ./...

check: test

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

## bench: the benchmarks, as ratios measured in one run (the all-reduce on both backends: tfdist's engine and TensorFlow's ring; TLS against plaintext, both over loopback TCP; DP-SGD against SGD; the ResNet and Transformer examples against Keras model.fit).
bench:
	@$(TFENV) $(GO) test -run '^$$' -bench . -benchtime 1x ./multiworker ./internal/cmd/digits
	@$(TFENV) $(GO) test -run '^$$' -bench AgainstKeras -benchtime 1x ./examples/resnet
	@$(TFENV) $(GO) test -run '^$$' -bench AgainstKeras -benchtime 1x ./examples/transformer
	@$(TFENV) dir=$$(mktemp -d) && trap 'rm -rf "$$dir"' EXIT && $(GO) build -o "$$dir/" ./cmd/tfdist && \
	for backend in tfdist tensorflow; do "$$dir/tfdist" bench allreduce --workers 2 --backend $$backend || exit 1; echo; done; \
	"$$dir/tfdist" bench allreduce --tls --tcp --sizes 16MiB,64MiB
	@$(TFENV) $(GO) test -run '^$$' -bench . -benchtime 200x ./mirrored ./dataset/... ./optimizer
	@$(TFENV) $(GO) test -run '^$$' -bench 'AllReduceTLS' -benchtime 10x ./collective
	@$(TFENV) $(GO) test -run '^$$' -bench . -benchtime 30x ./nn

## soak: train 50,000 steps under every strategy and check that no process's threads, memory, files or goroutines grow (tens of minutes).
SOAK_FLAGS ?=
soak:
	@$(TFENV) dir=$$(mktemp -d) && trap 'rm -rf "$$dir"' EXIT && \
	$(GO) build -o "$$dir/" ./cmd/tfdist ./internal/cmd/digits && "$$dir/tfdist" soak $(SOAK_FLAGS)

## notebooks: run the gophernotes notebooks headlessly (installs Jupyter's runner, builds the kernel once).
notebooks:
	@scripts/notebooks.sh

## notebooks-save: run them and save their outputs into the .ipynb files.
notebooks-save:
	@scripts/notebooks.sh --inplace
