"""Resolved by taehv-launch for `16 a800`: table row: the seeds' H100 table, 16 GPUs; a800: micro 2, accumulation 4 keeps the global batch 128.
global batch 128 = micro 2 x 16 GPUs x accumulation 4; 1536 frames of 480x720 per optimizer step.
Precedence: --set > --config > profile row > profile > defaults. Python: only run files you trust."""

from easydict import EasyDict

args = EasyDict()
args.data_root = ''  # folder of videos; empty on the cpu profile = built-in synthetic demo set
args.annotation_file = ''  # optional list of the videos instead of a scan: .json ({"list": [{"path": ...}]}), .jsonl, .csv or .txt (one path per line), as `taehv-launch index` writes; paths relative to data_root
args.height = 480  # training crop height (pixels, multiple of 8)
args.width = 720  # training crop width (pixels, multiple of 8)
args.n_frames = 12  # frames per clip; the default and the valid values follow ref_vae_type (12, 24, ... for the 4x families; 16, 40, ... for ltx2/ltx23; 39, 90, ... for h3: docs/families.md)
args.min_frame_delta = 1  # smallest frame stride when sampling a clip
args.max_frame_delta = 2  # largest frame stride when sampling a clip
args.random_flip = True  # random horizontal flip
args.validation_fraction = 0.05  # share of videos held out for validation
args.max_validation_videos = 64  # cap on held-out videos
args.validation_batch_size = 1  # clips per rank per validation batch
args.dataloader_num_workers = 12  # DataLoader worker processes per rank
args.prefetch_factor = 3  # batches prefetched per worker
args.video_decoder = 'auto'  # where training clips are decoded: nvdec (the GPU's hardware decoder, in the training process; needs the [nvdec] extra), opencv (CPU, in the DataLoader workers), auto (nvdec on GPUs when installed, else opencv)
args.video_decode_threads = 0  # with nvdec: decoding threads per rank, each with its own NVDEC session and CUDA stream; 0 = chosen from the sources' size and keyframe interval and the GPU (docs/guide.md)
args.index_cache_dir = ''  # where the dataset index is cached (default: <output_dir>/.index)
args.use_ref_vae = True  # distil from a reference VAE (False: the decoder trains on TAEHV's own encodings, with encoder_loss_weight=0; the encoder, which then has no target, is frozen)
args.ref_vae_type = 'cogvideox'  # reference VAE family (docs/families.md); upstream's file stems (taecvx, taehv, taew2_1, taew2_2, taehv1_5, taeltx_2, taeltx2_3, taeh3) are accepted too and stored as the family's name
args.ref_vae_path = ''  # local diffusers folder (with or without a vae/ subfolder); empty on cpu = built-in tiny VAE
args.ref_vae_dtype = 'bfloat16'  # dtype of the frozen reference VAE
args.allow_family_change = False  # let a resume distil from another reference VAE family than its checkpoint's (refused otherwise); the change is noted in the run
args.ref_vae_chunk_size = 1  # samples per reference encode call (memory/speed trade-off)
args.ref_latent_mean = ()  # optional per-channel mean subtracted from reference latents
args.ref_latent_std = ()  # optional per-channel std dividing reference latents
args.latent_cache = ''  # folder of a latent cache: `taehv-launch cache` writes it, training reads its views' reference latents instead of running the reference VAE
args.latent_cache_encode = 'never'  # with latent_cache, what the reference VAE encodes online: never (it is not loaded; unusable views are skipped), missing (views whose stored latents fail their check, and fresh clips of videos without cached views), always (every view: checks a cache)
args.latent_cache_dtype = 'bfloat16'  # dtype of the latents `taehv-launch cache` stores
args.cache_views = 4  # views per video that `taehv-launch cache` encodes (a view: fixed frames, crop, flip)
args.cache_shard_size = 64  # clips per cache shard file (a shard is written whole, or not at all)
args.pretrained_model_path = ''  # TAEHV weights to start from (.pth or .safetensors); empty = from scratch
args.patch_size = 1  # TAEHV pixel-shuffle patch size
args.latent_channels = 16  # TAEHV latent channels; must equal the reference VAE's
args.encoder_time_downscale = (True, True, False)  # temporal downscale per encoder stage
args.decoder_time_upscale = (False, True, True)  # temporal upscale per decoder stage
args.decoder_space_upscale = (True, True, True)  # spatial upscale per decoder stage
args.gradient_checkpointing = False  # recompute TAEHV blocks in backward (first memory lever)
args.decoder_arch = 'base'  # TAEHV decoder: base (upstream's) or super (upstream's Super decoder: widths 512/256/128/64, ~2x the decoder's parameters, e.g. taehv1_5_super); exports are named <upstream name>[_super]
args.reconstruction_loss_weight = 1.0  # weight of reconstruction_loss(decoded reference latents, frames) (0 = off)
args.reconstruction_loss = 'mse'  # the reconstruction loss: mse (mean squared error) or l1 (mean absolute error)
args.encoder_loss_weight = 1.0  # weight of MSE(encoder(frames), reference latents) (0 = the encoder is frozen)
args.seraena_loss_weight = 0.3  # weight of MSE(decoded, Seraena-corrected target) (0 = off)
args.freeze_encoder = False  # train the decoder only: the encoder keeps its starting weights (pretrained_model_path, or the seeded init) bit for bit; it is left out of the optimizer and of DDP, and not run when use_ref_vae
args.use_seraena = True  # adversarial corrections for the decoder
args.n_seraena_frames = 3  # frames grouped into one discriminator image
args.seraena_lr = 0.0003  # discriminator AdamW learning rate
args.seraena_buffer_mb = 1024  # replay buffer bound, MiB per rank
args.seraena_checkpoint_buffer_mb = 256  # save the replay buffer in checkpoints when it is at most this size
args.seraena_crop = 256  # Seraena trains and corrects on one random square crop of this many pixels per micro-batch (0 = the whole frame; else a multiple of 8 x patch_size, at most the clips' larger side)
args.micro_batch_size = 2  # clips per GPU per forward pass (DeepSpeed's train_micro_batch_size_per_gpu; the seeds' train_batch_size)
args.gradient_accumulation_steps = 4  # micro-batches per optimizer step
args.learning_rate = 0.0001  # peak AdamW learning rate
args.lr_scheduler = 'cosine'  # schedule after warmup
args.lr_warmup_steps = 1500  # linear warmup, in optimizer steps
args.min_lr_ratio = 0.0  # final LR as a fraction of the peak
args.max_train_steps = 100000  # optimizer steps
args.adam_beta1 = 0.9  # AdamW beta1
args.adam_beta2 = 0.95  # AdamW beta2
args.adam_weight_decay = 0.01  # AdamW weight decay
args.max_grad_norm = 1.0  # gradient clipping (DeepSpeed gradient_clipping)
args.ema_decay = 0.999  # EMA of TAEHV weights (the exported model)
args.mixed_precision = 'bf16'  # autocast dtype
args.zero_stage = 0  # DeepSpeed ZeRO stage (0 = plain DDP)
args.bucket_size_mb = 0  # DeepSpeed reduce/allgather bucket in MB (0 = the profile row's: 500-1000 MB)
args.seed = 42  # global seed (each rank offsets it)
args.max_consecutive_bad_steps = 20  # bad micro-batches (non-finite, or a loss spike) skipped in a row before the run rolls back to its last complete checkpoint (or stops, when there is none)
args.loss_spike_factor = 10.0  # a micro-batch whose loss is above this many times the running median is skipped (0 = off)
args.loss_spike_window = 200  # micro-batches in the loss's running median (the spike check starts once full)
args.rollback_lr_factor = 0.5  # after a rollback the learning rate is multiplied by this for rollback_lr_steps (1.0 = unchanged)
args.rollback_lr_steps = 1000  # optimizer steps the lowered learning rate lasts after a rollback
args.rollback_window = 2000  # a second rollback within this many optimizer steps of the previous one stops the run
args.hang_timeout = 300  # seconds a rank may make no progress (step or phase) before the job is stopped as hung, every rank dumping its stacks into <run>/heartbeat/stacks (0 = off; the NCCL timeout stays the backstop; at least 10 s, twice the heartbeat period)
args.hang_timeout_slow = 1800  # the same limit during phases known to be long: set-up, compile warm-up, checkpoint, validation
args.straggler_threshold = 0.2  # a rank whose step time is this fraction above the other ranks' median is named at each log line (0 = no line)
args.max_requeues_without_progress = 3  # sbatch/k8s: the job stops requeueing when this many attempts in a row ended with no newer complete checkpoint (0 = no limit)
args.max_restarts = 3  # after a rank failure or a hang, the launcher restarts the ranks in place from the newest complete checkpoint up to this many times per launch (0 = off: the job ends, the scheduler requeues)
args.max_restarts_without_progress = 2  # restarts in a row that get past no checkpoint newer than the one they started from before the job ends (0 = no limit)
args.compile = 'all'  # torch.compile on GPU: the reference VAE encoder, or it and TAEHV (1-2 min warm-up, cached)
args.compile_mode = 'default'  # torch.compile's mode for TAEHV (with compile='all'): default; max-autotune-no-cudagraphs (Triton autotuning, minutes more warm-up); reduce-overhead and max-autotune add CUDA graphs (docs/guide.md). The reference encoder keeps the default
args.step_stream_priority = 'high'  # CUDA stream of the training step when NVDEC cuts the clips: high runs it on the highest-priority stream, so the decode threads' colour conversion and resize take only the SMs it leaves (+8% at long-GOP 1080p from the cache on one H100, docs/benchmarks.md); default keeps the default stream (as do runs decoding on the CPU and ZeRO-3 with fp16)
args.compile_cache_dir = ''  # Inductor cache kept across restarts (default: <output_dir>/.compile-cache)
args.fused_optimizer = True  # AdamW's fused CUDA kernel (ignored on CPU)
args.channels_last = True  # compiled TAEHV runs its frames channels-last (NHWC): no cuDNN layout transposes (only with compile='all' on GPU)
args.compile_layout = 'force'  # compiled TAEHV's activation layout between kernels: force keeps channels-last through the whole graph (Inductor's layout optimisation forced: no cuDNN layout transposes around each convolution); auto leaves it to Inductor, whose heuristic declines it for TAEHV's 128->64-channel convolutions
args.ref_channels_last = True  # the compiled reference encoder keeps its activations channels-last (NDHWC, 8-18% faster encode measured for all three families; only with compile on GPU)
args.output_dir = 'output'  # parent of run directories
args.trackers = 'tensorboard'  # where scalars and validation clips go, comma-separated: tensorboard, wandb, mlflow, swanlab (all but tensorboard need their extra: pip install 'taehv-launch[wandb]')
args.log_every = 20  # steps between log lines / scalars
args.validation_steps = 500  # steps between validations
args.validation_at_start = False  # also validate before the first step of a fresh run: the untrained baseline in val/psnr
args.max_validation_batches = 8  # batches per validation pass
args.checkpointing_steps = 1000  # steps between checkpoints
args.checkpoints_total_limit = 3  # checkpoints kept (newest complete and best are never deleted)
args.num_sample_clips = 2  # reconstructed clips written to TensorBoard at validation
args.nccl_timeout = 7200  # process-group timeout in seconds (reaches init_process_group)
args.profile_steps = 5  # steps traced by --profile
