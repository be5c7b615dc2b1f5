"""headlab's Hydra plugins: the grid and search sweepers and the packed and SLURM launchers (Hydra finds plugins in the
hydra_plugins namespace package). They are shells over headlab.launch, which they alone import from headlab."""


def register() -> None:
    """Make the plugins known to Hydra (its own scan of the hydra_plugins namespace misses them in an editable
    install) and the configs' resolvers to OmegaConf: what a console script does before Hydra composes a config."""
    from hydra.core.plugins import Plugins

    from headlab.launch import runtime
    from hydra_plugins.headlab_launcher.grid_sweeper import GridSweeper
    from hydra_plugins.headlab_launcher.packed_launcher import PackedLauncher
    from hydra_plugins.headlab_launcher.search_sweeper import SearchSweeper
    from hydra_plugins.headlab_launcher.slurm_launcher import SlurmLauncher

    for plugin in (GridSweeper, SearchSweeper, PackedLauncher, SlurmLauncher):
        Plugins.instance().register(plugin)
    runtime.configure()
