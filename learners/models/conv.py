"""The built-in conv encoder (`model.encoder: conv`): a small Nature-CNN-like stack over
`[C, H, W]` float observations, then the configured MLP head (`learners.models.mlp`).

The Nature DQN stack (conv 8x8 stride 4, 4x4 stride 2, 3x3 stride 1 on 84x84 frames) leaves
nothing of a 32x32 image after its second layer. Scaled down for small images, layer i of
`channels` is:

- i = 0, 1: 4x4 kernel, stride 2, padding 1 (halves H and W, rounding down);
- i >= 2: 3x3 kernel, stride 1, padding 1 (keeps H and W);

each followed by the activation. With the default channels (16, 32, 32) a 3x32x32 image
becomes 32x8x8 = 2048 features and a 3x64x64 one 32x16x16 = 8192; any image of at least
4x4 pixels gives at least one feature per channel. The features are flattened (positions
matter: no pooling) and fed to the head, so the head's parameters are those of the flat
MLP on a `[features]` observation, under `head.`.
"""

from __future__ import annotations

from torch import Tensor, nn

from learners.models.mlp import activation_layer, mlp_network

_HALVING_LAYERS = 2
"""How many leading layers are 4x4 stride 2 (the others 3x3 stride 1)."""


class ConvEncoder(nn.Module):
    """Conv layers with an activation after each, from `[..., C, H, W]` to `[..., features]`."""

    def __init__(
        self,
        image_shape: tuple[int, int, int],
        channels: tuple[int, ...] = (16, 32, 32),
        activation: str = "relu",
    ) -> None:
        super().__init__()
        in_channels, height, width = image_shape
        layers: list[nn.Module] = []
        for index, out_channels in enumerate(channels):
            kernel, stride = (4, 2) if index < _HALVING_LAYERS else (3, 1)
            layers += [
                nn.Conv2d(in_channels, out_channels, kernel, stride, padding=1),
                activation_layer(activation),
            ]
            in_channels = out_channels
            height, width = (height - kernel + 2) // stride + 1, (width - kernel + 2) // stride + 1
        if height < 1 or width < 1:
            raise ValueError(
                f"images of shape {list(image_shape)} are too small for {len(channels)} conv "
                "layers; expected at least 4x4 pixels"
            )
        self.layers = nn.Sequential(*layers)
        self.image_shape = tuple(image_shape)
        self.features = in_channels * height * width
        """Size of the flattened output."""

    def forward(self, obs: Tensor) -> Tensor:
        # Conv2d takes one batch dimension: fold the leading ones into it and back.
        leading = obs.shape[:-3]
        images = obs.reshape(-1, *self.image_shape)
        return self.layers(images).reshape(*leading, self.features)


class ConvNetwork(nn.Module):
    """`ConvEncoder` then the MLP head; forward passes any further inputs (the actions of a
    mean_advantage head) to the head."""

    def __init__(self, encoder: ConvEncoder, head: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = head

    def forward(self, obs: Tensor, *inputs: Tensor) -> Tensor | dict[str, Tensor]:
        return self.head(self.encoder(obs), *inputs)


def conv_network(
    obs_shape: tuple[int, ...],
    action_dim: int,
    *,
    conv_channels: tuple[int, ...] = (16, 32, 32),
    head: str = "deterministic",
    hidden_sizes: tuple[int, ...] = (40, 40),
    activation: str = "relu",
    log_std_init: float = 0.0,
    advantage_hidden_sizes: tuple[int, ...] = (32,),
) -> nn.Module:
    """The built-in conv network over `[C, H, W]` observations (initialised from the current
    global RNG): `ConvEncoder` with `conv_channels`, then `mlp_network`'s head."""
    if len(obs_shape) != 3:
        raise ValueError(
            f"the conv encoder reads [C, H, W] observations, got obs_shape {list(obs_shape)}"
        )
    encoder = ConvEncoder(
        (obs_shape[0], obs_shape[1], obs_shape[2]), tuple(conv_channels), activation
    )
    head_network = mlp_network(
        (encoder.features,),
        action_dim,
        head=head,
        hidden_sizes=hidden_sizes,
        activation=activation,
        log_std_init=log_std_init,
        advantage_hidden_sizes=advantage_hidden_sizes,
    )
    return ConvNetwork(encoder, head_network)
