"""Images for vision-language models (Qwen3-VL): decoding and limits (`images`), the model's vision tokens
and image processor (`vision`), placeholder rendering and expansion (`placeholders`), and the extra forward
inputs — pixel values, grid sizes and 3-D rotary positions — that rollout and trainer both feed the model
(`forward`).

One convention everywhere: a prompt carries its images as base64 text of the encoded files, in the order of
its placeholders, and its token ids with every image placeholder already expanded to that image's number of
vision tokens. Pixel values are a pure function of (image, image processor), so the rollout replicas and the
trainer compute identical ones from the same model directory.
"""
