from swarm_trainer.app import main

if __name__ == "__main__":
    main()
