"""Agents of seed 000 section III trained on the active-perception rooms: DQN and REINFORCE with
entropy, their replay buffer, training histories and checkpoints."""

from leaklab.rl.agents.checkpoint import load_agent, save_agent
from leaklab.rl.agents.common import AgentConfig, TrainHistory
from leaklab.rl.agents.dqn import DQNConfig, epsilon_greedy, td_targets, train_dqn
from leaklab.rl.agents.evaluate import evaluate
from leaklab.rl.agents.reinforce import ReinforceConfig, discounted_returns, sample_action, train_reinforce
from leaklab.rl.agents.replay import ReplayBuffer

__all__ = ["AgentConfig", "DQNConfig", "ReinforceConfig", "ReplayBuffer", "TrainHistory",
           "discounted_returns", "epsilon_greedy", "evaluate", "load_agent", "sample_action", "save_agent",
           "td_targets", "train_dqn", "train_reinforce"]
