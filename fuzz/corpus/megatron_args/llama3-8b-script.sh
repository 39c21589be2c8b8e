#!/bin/bash
# Llama 3 8B on 2 nodes
TP=2
GPT_ARGS=(
    --num-layers 32 --hidden-size 4096 --num-attention-heads 32
    --group-query-attention --num-query-groups 8
    --ffn-hidden-size 14336 --swiglu --normalization RMSNorm --norm-epsilon 1e-05
    --position-embedding-type rope --rotary-base 500000
    --max-position-embeddings 8192 --seq-length 8192
    --untie-embeddings-and-output-weights --disable-bias-linear
    --tokenizer-type NullTokenizer --vocab-size 128256 --make-vocab-size-divisible-by 1
    --hidden-dropout 0 --attention-dropout 0 --attention-backend flash
)
torchrun --nproc_per_node 8 --nnodes 2 pretrain_gpt.py \
    "${GPT_ARGS[@]}" \
    --tensor-model-parallel-size $TP --pipeline-model-parallel-size 2 \
    --sequence-parallel --use-distributed-optimizer --overlap-grad-reduce \
    --micro-batch-size 1 --global-batch-size 64 --bf16 \
    --lr 3e-4 --train-iters 100 --mock-data --log-interval 1 # comment
